"""tune's CUDA and NPU source edits (:func:`_device_pass`, run by :func:`helpers.tune.rewrite.apply_edits` before
the other edits), and the static reading they rest on (:func:`factory_moves`, :func:`sync_statement`).

- ``matmul_precision``: before the statement on ``line`` (the optimizer's construction),
  ``torch.set_float32_matmul_precision("high")`` on CUDA, ``torch.npu.matmul.allow_hf32 = True`` on an NPU
  (``params["device"]``);
- ``device_factory``: the ``torch.zeros(...).to(device)`` (or ``.cuda()``) on ``line`` made
  ``torch.zeros(..., device=device)``: made on the device, not made on the host and copied;
- ``sync_every``: the logging statement on ``line`` whose value is read back to the host (``print(loss.item())``)
  put under ``if <index> % N == 0:``, with the loop's own counter (``params["index"]``, ``params["every"]``).
"""

from __future__ import annotations

import functools
from typing import Any, Sequence

import libcst as cst
from libcst.metadata import MetadataWrapper, ParentNodeProvider, PositionProvider, QualifiedNameProvider

from helpers.tune.rewrite_common import Code, Edit, _after_imports, _follow_lines, _imports, _set_keywords

#: The edits of this pass.
DEVICE_KINDS = ("matmul_precision", "device_factory", "sync_every")
#: torch's tensor factories that take ``device=`` (torch 2.13's signatures); a host-made one copied to the device
#: can be made there instead.
FACTORIES = ("tensor", "as_tensor", "zeros", "ones", "empty", "full", "arange", "linspace", "logspace", "eye")
#: Random factories: made on the device they draw from its generator, not the CPU's, so the numbers change, and so
#: does every later draw of the CPU's generator (a DataLoader's shuffle): found, never rewritten.
RANDOM_FACTORIES = ("rand", "randn", "randint", "randperm", "rand_like", "randn_like")
#: Calls whose statement only logs (its value unused): ``print``, ``logging``/a logger's methods, a
#: SummaryWriter's ``add_scalar``, ``wandb.log``, a tqdm bar's ``set_postfix``/``set_description``: such a statement
#: can run every N steps.
LOG_CALLS = ("print", "debug", "info", "warning", "log", "add_scalar", "add_scalars", "write", "set_postfix",
             "set_description")


def _device_arg(node: cst.BaseExpression) -> bool:
    """Whether ``node`` reads as a device (not a tensor, whose ``.to(t)`` would take its dtype too): a string, a
    ``torch.device(...)`` call, ``x.device``, or a name that says device (``device``, ``args.dev``)."""
    if isinstance(node, cst.SimpleString):
        return True
    if isinstance(node, cst.Call):
        return isinstance(node.func, cst.Attribute) and node.func.attr.value == "device"
    name = node.attr.value if isinstance(node, cst.Attribute) else node.value if isinstance(node, cst.Name) else ""
    return "device" in name.lower() or name.lower() in ("dev", "cuda", "npu")


def _factory_move(call: cst.Call, qualified) -> tuple[dict[str, Any], cst.Call | None]:
    """Whether ``call`` is ``torch.F(...).to(dev)`` / ``.cuda()``: its description, and the rewritten call (None
    where it cannot be written, the reason in the description's ``why``)."""
    if not isinstance(call.func, cst.Attribute) or call.func.attr.value not in ("to", "cuda"):
        return {}, None
    inner = call.func.value
    if not isinstance(inner, cst.Call):
        return {}, None
    names = {q.name for q in qualified(inner.func)}
    factory = next((n.split(".", 1)[1] for n in names if n.startswith("torch.") and n.count(".") == 1), None)
    if factory is None or (factory not in FACTORIES and factory not in RANDOM_FACTORIES):
        return {}, None
    found: dict[str, Any] = {"factory": f"torch.{factory}", "method": call.func.attr.value}
    if factory in RANDOM_FACTORIES:
        found["why"] = (f"torch.{factory} made on the device draws from the device's generator, not the CPU's: its "
                        f"numbers change, and so does every later draw of the CPU's (a DataLoader's shuffle)")
        return found, None
    if any(a.star for a in list(call.args) + list(inner.args)):
        found["why"] = "the call passes *args or **kwargs"
        return found, None
    keywords = {a.keyword.value: a.value for a in call.args if a.keyword is not None}
    positional = [a.value for a in call.args if a.keyword is None]
    values: dict[str, Any] = {}
    if call.func.attr.value == "cuda":
        if positional or set(keywords) - {"non_blocking"}:
            found["why"] = ".cuda(...) is given a device index or other arguments; write device= by hand"
            return found, None
        values["device"] = "cuda"
    else:
        device = keywords.get("device", positional[0] if positional else None)
        dtype = keywords.get("dtype", positional[1] if len(positional) > 1 else None)
        if device is None or len(positional) > 2 or set(keywords) - {"device", "dtype", "non_blocking"} \
                or not _device_arg(device):
            found["why"] = (".to(...)'s argument may be a tensor (whose dtype it takes too) or more than a device; "
                            "write device= by hand")
            return found, None
        values["device"] = Code(cst.Module(body=[]).code_for_node(device))
        if dtype is not None:
            if any(a.keyword is not None and a.keyword.value == "dtype" for a in inner.args):
                found["why"] = "both the factory and .to(...) give a dtype"
                return found, None
            values["dtype"] = Code(cst.Module(body=[]).code_for_node(dtype))
    new = _set_keywords(inner, values)
    return found, new.with_changes(lpar=call.lpar, rpar=call.rpar)


def factory_moves(source: str) -> dict[int, dict[str, Any]]:
    """The tensors a file makes on the host and then copies to a device in one expression
    (``torch.zeros(3).to(device)``, ``torch.tensor(x).cuda()``), by each line of the ``.to(...)`` call.

    Returns
    -------
    dict of int to dict
        ``{line: {"factory": "torch.zeros", "method": "to" | "cuda", "code": the expression, "why": why it is not
        rewritten, absent where it is}}``; empty for a file that does not parse.
    """
    return {line: dict(found) for line, found in _factory_moves(source).items()}


@functools.lru_cache(maxsize=8)
def _factory_moves(source: str) -> dict[int, dict[str, Any]]:
    try:
        module = cst.parse_module(source)
    except cst.ParserSyntaxError:
        return {}
    wrapper = MetadataWrapper(module)
    out: dict[int, dict[str, Any]] = {}

    class Finder(cst.CSTVisitor):
        METADATA_DEPENDENCIES = (PositionProvider, QualifiedNameProvider)

        def visit_Call(self, node: cst.Call) -> None:
            found, _ = _factory_move(node, lambda n: self.get_metadata(QualifiedNameProvider, n, set()))
            if found:
                pos = self.get_metadata(PositionProvider, node)
                found["code"] = module.code_for_node(node).strip()[:120]
                for line in range(pos.start.line, pos.end.line + 1):
                    out.setdefault(line, found)

    wrapper.visit(Finder())
    return out


@functools.lru_cache(maxsize=8)
def _parsed(source: str) -> tuple[MetadataWrapper, Any, Any] | None:
    """A file's tree with its positions and parents, parsed once for all its synchronising lines; None where it
    does not parse."""
    try:
        wrapper = MetadataWrapper(cst.parse_module(source))
    except cst.ParserSyntaxError:
        return None
    return wrapper, wrapper.resolve(PositionProvider), wrapper.resolve(ParentNodeProvider)


def sync_statement(source: str, line: int) -> dict[str, Any]:
    """What the statement on ``line`` does with the value it reads back from the device.

    Parameters
    ----------
    source : str
        The file's text.
    line : int
        1-based line the probe saw synchronise.

    Returns
    -------
    dict
        ``kind``: ``"log"`` (an expression statement calling one of :data:`LOG_CALLS`: its value goes nowhere
        else), ``"control"`` (an ``if``/``while`` test or an ``assert``: the script branches on it), ``"kept"``
        (an assignment: the value is kept, e.g. a running total) or ``"other"``; ``text``, the statement's first
        line; ``index``, the counter of the innermost ``for`` loop around it (``for i, batch in
        enumerate(loader)``'s ``i``, ``for step in range(n)``'s ``step``), or None; ``guarded``, whether an ``if``
        around it in that loop already tests ``%``.
    """
    parsed = _parsed(source)
    if parsed is None:
        return {"kind": "other", "text": "", "index": None, "guarded": False}
    wrapper, pos, parents = parsed
    best: list[cst.CSTNode] = []

    class Finder(cst.CSTVisitor):
        def on_visit(self, node: cst.CSTNode) -> bool:
            p = pos.get(node)
            if p is None or not p.start.line <= line <= p.end.line:
                return p is None
            if isinstance(node, (cst.SimpleStatementLine, cst.If, cst.While)):
                if isinstance(node, cst.SimpleStatementLine) or p.start.line == line:
                    best.append(node)
            return True

    wrapper.module.visit(Finder())
    if not best:
        return {"kind": "other", "text": "", "index": None, "guarded": False}
    stmt = best[-1]
    text = wrapper.module.code_for_node(stmt).strip().splitlines()[0][:160] if stmt else ""
    kind = "other"
    if isinstance(stmt, (cst.If, cst.While)):
        kind = "control"
    elif isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1:
        small = stmt.body[0]
        if isinstance(small, cst.Assert):
            kind = "control"
        elif isinstance(small, (cst.Assign, cst.AugAssign, cst.AnnAssign)):
            kind = "kept"
        elif isinstance(small, cst.Expr) and isinstance(small.value, cst.Call):
            func = small.value.func
            name = func.attr.value if isinstance(func, cst.Attribute) else func.value if isinstance(func, cst.Name) \
                else ""
            kind = "log" if name in LOG_CALLS else "other"
    index, guarded = None, False
    node = parents.get(stmt)
    while node is not None and index is None:
        if isinstance(node, cst.If) and "%" in wrapper.module.code_for_node(node.test):
            guarded = True
        if isinstance(node, cst.For):
            index = _loop_counter(node)
            break
        if isinstance(node, (cst.FunctionDef, cst.ClassDef)):
            break
        node = parents.get(node)
    return {"kind": kind, "text": text, "index": index, "guarded": guarded}


def _loop_counter(loop: cst.For) -> str | None:
    """The loop's step counter: ``i`` of ``for i, ... in enumerate(...)`` (started at 0 or 1), ``step`` of
    ``for step in range(...)``; None otherwise."""
    it = loop.iter
    if not isinstance(it, cst.Call) or not isinstance(it.func, cst.Name):
        return None
    target = loop.target
    if it.func.value == "enumerate" and isinstance(target, cst.Tuple) and target.elements \
            and isinstance(target.elements[0].value, cst.Name):
        return target.elements[0].value.value
    if it.func.value == "range" and isinstance(target, cst.Name):
        return target.value
    return None


class _DeviceEditor(cst.CSTTransformer):
    """The :data:`DEVICE_KINDS` edits (see :func:`_device_pass`)."""

    METADATA_DEPENDENCIES = (PositionProvider, QualifiedNameProvider)

    def __init__(self, edits: Sequence[Edit]) -> None:
        super().__init__()
        self.edits = list(edits)
        self.done: set[int] = set()
        self.why: dict[int, str] = {}
        self.needs_torch = False

    def _lines(self, node) -> tuple[int, int]:
        pos = self.get_metadata(PositionProvider, node)
        return pos.start.line, pos.end.line

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        start, end = self._lines(original)
        for i, e in enumerate(self.edits):
            if e.kind != "device_factory" or i in self.done or not start <= e.line <= end:
                continue
            inner = original.func.value if isinstance(original.func, cst.Attribute) else None
            if not isinstance(inner, cst.Call):
                continue
            names = self.get_metadata(QualifiedNameProvider, inner.func, set())  # read on the original node
            found, new = _factory_move(updated, lambda n: names)
            if not found:
                continue
            if new is None:
                self.why[i] = found.get("why", "not a factory copied to the device")
                continue
            self.done.add(i)
            return new
        return updated

    def _block(self, original: Sequence[cst.BaseStatement],
               body: Sequence[cst.BaseStatement]) -> list[cst.BaseStatement]:
        out: list[cst.BaseStatement] = []
        for orig, stmt in zip(original, body):
            start, end = self._lines(orig)
            for i, e in enumerate(self.edits):
                if i in self.done or not start <= e.line <= end:
                    continue
                if e.kind == "matmul_precision":
                    code = ('torch.set_float32_matmul_precision("high")  # TF32 tensor cores for float32 matmuls'
                            if e.params.get("device", "cuda") == "cuda" else
                            "torch.npu.matmul.allow_hf32 = True  # HF32 for float32 matmuls")
                    new = cst.parse_statement(code + "\n").with_changes(leading_lines=stmt.leading_lines)
                    out.append(new)
                    stmt = stmt.with_changes(leading_lines=[])
                    self.done.add(i)
                    self.needs_torch = True
                elif e.kind == "sync_every" and isinstance(stmt, cst.SimpleStatementLine) and e.params.get("index"):
                    test = cst.parse_expression(f"{e.params['index']} % {int(e.params.get('every', 10))} == 0")
                    stmt = cst.If(test=test, body=cst.IndentedBlock(body=[stmt.with_changes(leading_lines=[])]),
                                  leading_lines=stmt.leading_lines)
                    self.done.add(i)
            out.append(stmt)
        return out

    def leave_IndentedBlock(self, original: cst.IndentedBlock, updated: cst.IndentedBlock) -> cst.IndentedBlock:
        return updated.with_changes(body=self._block(original.body, updated.body))

    def leave_Module(self, original: cst.Module, updated: cst.Module) -> cst.Module:
        body = self._block(original.body, updated.body)
        if self.needs_torch and not _imports(original, "torch"):
            at = _after_imports(body)
            body = body[:at] + [cst.parse_statement("import torch\n")] + body[at:]
        return updated.with_changes(body=body)


def _device_pass(module: cst.Module, edits: list[Edit]) -> tuple[str, list[Edit], list[tuple[Edit, str]], list[Edit]]:
    """Make the :data:`DEVICE_KINDS` edits of ``edits``; the others come back with their lines moved to where their
    text now is.

    Returns
    -------
    (str, list of Edit, list of (Edit, str), list of Edit)
        The new text, the device edits made, those not made with the reason, and the other edits (lines mapped).
    """
    mine = [e for e in edits if e.kind in DEVICE_KINDS]
    rest = [e for e in edits if e.kind not in DEVICE_KINDS]
    editor = _DeviceEditor(mine)
    new = MetadataWrapper(module).visit(editor).code
    made = [e for i, e in enumerate(mine) if i in editor.done]
    where = {"matmul_precision": "no statement on that line",
             "device_factory": "no torch factory copied with .to(...) or .cuda() on that line",
             "sync_every": "no statement of its own on that line inside a loop with a counter"}
    skipped = [(e, f"{editor.why.get(i) or where[e.kind]} (line {e.line})") for i, e in enumerate(mine)
               if i not in editor.done]
    return new, made, skipped, _follow_lines(module.code, new, rest)
