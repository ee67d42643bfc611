"""tune's DistributedDataParallel rewrite (:func:`_ddp_pass`, run by :func:`helpers.tune.rewrite.apply_edits`
before the other edits): ``no_sync()`` over the micro-steps that do not step, the DDP call's keywords, the
compression hook, and the imports they need in isort's order."""

from __future__ import annotations

import sys
from typing import Sequence

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider, QualifiedNameProvider

from helpers.tune.rewrite_common import (COMM_HOOKS_IMPORT, DDP_KINDS, DDP_NAMES, Edit, _after_imports,
                                         _follow_lines, _import_root, _imports, _names_used,
                                         _set_keywords)


def _negated(test: cst.BaseExpression, module: cst.Module) -> str:
    """The code of ``not test``, as a person writes it: ``a % k != 0`` for ``a % k == 0`` (and the reverse),
    ``x`` for ``not x``, else ``not (test)``."""
    if isinstance(test, cst.Comparison) and len(test.comparisons) == 1 and not test.lpar:
        c = test.comparisons[0]
        flip = {cst.Equal: cst.NotEqual, cst.NotEqual: cst.Equal}.get(type(c.operator))
        if flip is not None:
            op = flip(whitespace_before=c.operator.whitespace_before, whitespace_after=c.operator.whitespace_after)
            return module.code_for_node(test.with_changes(comparisons=[c.with_changes(operator=op)])).strip()
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        return module.code_for_node(test.expression.with_changes(lpar=[], rpar=[])).strip()
    code = module.code_for_node(test).strip()
    simple = isinstance(test, (cst.Name, cst.Attribute, cst.Call, cst.Subscript, cst.Comparison)) and not test.lpar
    return f"not {code}" if simple else f"not ({code})"


class _DDPEditor(cst.CSTTransformer):
    """The ``no_sync``, ``ddp_keywords`` and ``comm_hook`` edits (see :func:`_ddp_pass`)."""

    METADATA_DEPENDENCIES = (PositionProvider, QualifiedNameProvider)

    def __init__(self, module: cst.Module, edits: Sequence[Edit]) -> None:
        super().__init__()
        self.module = module
        self.edits = list(edits)
        self.done: set[int] = set()
        self.why: dict[int, str] = {}
        self.needs_contextlib = False
        self.needs_hooks = False
        taken = _names_used(module)
        self.hooks_taken = "default_hooks" in taken and not _has_import(module, COMM_HOOKS_IMPORT)
        self.contextlib_taken = "contextlib" in taken and not _imports(module, "contextlib")

    def _span(self, node) -> tuple[int, int]:
        pos = self.get_metadata(PositionProvider, node)
        return pos.start.line, pos.end.line

    def _is_ddp(self, call: cst.Call) -> bool:
        return bool({q.name for q in self.get_metadata(QualifiedNameProvider, call.func, set())} & DDP_NAMES)

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        start, _ = self._span(original)
        for i, e in enumerate(self.edits):
            if e.kind == "ddp_keywords" and start == e.line and i not in self.done and self._is_ddp(original):
                if any(a.star for a in original.args):
                    self.why[i] = ("the DistributedDataParallel(...) call passes *args or **kwargs, which may set "
                                   "these already: set them where those arguments are made")
                    continue
                updated = _set_keywords(updated, e.params.get("values") or {})
                self.done.add(i)
        return updated

    def leave_IndentedBlock(self, original: cst.IndentedBlock, updated: cst.IndentedBlock) -> cst.IndentedBlock:
        return updated.with_changes(body=self._block(original.body, updated.body))

    def leave_Module(self, original: cst.Module, updated: cst.Module) -> cst.Module:
        body = self._block(original.body, updated.body)
        if self.needs_contextlib and not _imports(original, "contextlib"):
            body = _with_stdlib_import(body, "contextlib")
        if self.needs_hooks and not _has_import(original, COMM_HOOKS_IMPORT):
            body = _with_torch_from_import(body, COMM_HOOKS_IMPORT)
        return updated.with_changes(body=body)

    def _block(self, original: Sequence[cst.BaseStatement], body: Sequence[cst.BaseStatement]) -> list:
        out = list(body)
        after: dict[int, list[cst.BaseStatement]] = {}  # statements inserted after out[k]
        wraps: list[tuple[int, int, str]] = []  # (first, last, the with's header) over out's indices
        for i, e in enumerate(self.edits):
            if i in self.done:
                continue
            at = next((k for k, stmt in enumerate(original) if isinstance(stmt, cst.SimpleStatementLine)
                       and self._span(stmt)[0] <= e.line <= self._span(stmt)[1]), None)
            if at is None:
                continue
            if e.kind == "comm_hook":
                target = self._assigned_ddp(original[at])
                if target is None:
                    self.why[i] = ("the DistributedDataParallel(...) call is not assigned to one name on a line of "
                                   "its own (model = DDP(...))")
                elif self.hooks_taken:
                    self.why[i] = "the file already uses the name default_hooks for something else"
                else:
                    after.setdefault(at, []).append(cst.parse_statement(
                        f"{target}.register_comm_hook(None, default_hooks.{e.params.get('dtype', 'fp16')}"
                        f"_compress_hook)\n"))
                    self.needs_hooks = True
                    self.done.add(i)
            elif e.kind == "no_sync":
                header = self._no_sync_header(i, e, original, at)
                if header is not None:
                    first = next(k for k, stmt in enumerate(original) if k <= at and any(
                        self._span(stmt)[0] <= n <= self._span(stmt)[1] for n in e.params.get("forward") or []))
                    wraps.append((first, at, header))
                    self.needs_contextlib = True
                    self.done.add(i)
        if not after and not wraps:
            return out
        new: list[cst.BaseStatement] = []
        k = 0
        while k < len(out):
            wrap = next((w for w in wraps if w[0] == k), None)
            if wrap is not None:
                first, last, header = wrap
                inner = [out[first].with_changes(leading_lines=[])] + out[first + 1:last + 1]
                with_ = cst.parse_statement(header + ":\n    pass\n")
                new.append(with_.with_changes(body=cst.IndentedBlock(body=inner),
                                              leading_lines=out[first].leading_lines))
                for j in range(first, last + 1):
                    new += after.get(j, [])
                k = last + 1
                continue
            new.append(out[k])
            new += after.get(k, [])
            k += 1
        return new

    def _assigned_ddp(self, stmt: cst.SimpleStatementLine) -> str | None:
        """The target of ``NAME = DistributedDataParallel(...)`` (or ``self.model = DDP(...)``), the statement's
        only one; None otherwise."""
        if len(stmt.body) != 1 or not isinstance(stmt.body[0], cst.Assign):
            return None
        assign = stmt.body[0]
        if len(assign.targets) != 1 or not isinstance(assign.value, cst.Call) or not self._is_ddp(assign.value):
            return None
        target = assign.targets[0].target
        if not isinstance(target, (cst.Name, cst.Attribute)):
            return None
        return self.module.code_for_node(target).strip()

    def _no_sync_header(self, i: int, e: Edit, original: Sequence[cst.BaseStatement], at: int) -> str | None:
        """``with NAME.no_sync() if <the step's condition, negated> else contextlib.nullcontext()`` for the
        ``backward()`` statement ``original[at]``, or None with the reason in ``why``."""
        name, step = e.params.get("name"), e.params.get("step")
        if not name:
            self.why[i] = "no variable where backward() is called holds the DDP model"
            return None
        if self.contextlib_taken:
            self.why[i] = "the file already uses the name contextlib for something else"
            return None
        guard = next((stmt for stmt in original[at + 1:] if isinstance(stmt, cst.If) and step is not None
                      and self._span(stmt.body)[0] <= step <= self._span(stmt.body)[1]), None)
        if guard is None:
            self.why[i] = (f"the optimizer's step() (line {step}) is not under an if statement after backward() in "
                           f"the same loop, whose condition would say which micro-step synchronises: put the "
                           f"micro-steps that do not step the optimizer under {name}.no_sync() by hand")
            return None
        if not any(self._span(stmt)[0] <= n <= self._span(stmt)[1] for stmt in original[:at + 1]
                   for n in e.params.get("forward") or []):
            self.why[i] = ("the model's forward call is not in the same loop body as backward(), before it: "
                           "no_sync() must hold the forward pass too")
            return None
        return f"with {name}.no_sync() if {_negated(guard.test, self.module)} else contextlib.nullcontext()"


def _has_import(module: cst.Module, line: str) -> bool:
    """Whether the module's top level has the import statement ``line``, written as it is."""
    return any(isinstance(stmt, cst.SimpleStatementLine) and module.code_for_node(stmt).strip() == line
               for stmt in module.body)


def _import_block(body: Sequence[cst.BaseStatement]) -> range:
    """The indices of the module's leading import statements (after its docstring)."""
    start = 1 if body and isinstance(body[0], cst.SimpleStatementLine) and not _import_root(body[0]) \
        and isinstance(body[0].body[0], cst.Expr) else 0
    return range(start, max(start, _after_imports(body)))


def _insert(body: list, at: int, stmt: cst.SimpleStatementLine, *, own_group: bool = False) -> list:
    """``body`` with ``stmt`` at ``at``: the statement there hands its leading lines (a comment, the blank line
    before its group) to ``stmt``; ``own_group``: a blank line then separates ``stmt`` from it."""
    if at < len(body):
        lead = body[at].leading_lines
        body = body[:at] + [stmt.with_changes(leading_lines=lead)] + [
            body[at].with_changes(leading_lines=[cst.EmptyLine()] if own_group else [])] + body[at + 1:]
        return body
    return body + [stmt]


def _with_stdlib_import(body: list, name: str) -> list:
    """``body`` with ``import name`` (a standard-library module) where isort puts it: among the leading block's
    standard-library ``import`` statements in alphabetical order (before its ``from`` imports), else as its own
    group before the third-party imports."""
    block = _import_block(body)
    stmt = cst.parse_statement(f"import {name}\n")
    std = [k for k in block if _import_root(body[k]) in sys.stdlib_module_names and _import_root(body[k])
           != "__future__"]
    plain = [k for k in std if isinstance(body[k].body[0], cst.Import)]
    later = [k for k in plain if _dotted(body[k]) > name]
    if later:
        return _insert(body, later[0], stmt)
    if plain:  # after the last: the statement after it keeps its own leading lines (its group's blank line)
        return body[:plain[-1] + 1] + [stmt] + body[plain[-1] + 1:]
    if std:
        return _insert(body, std[0], stmt)
    first = next((k for k in block if _import_root(body[k]) != "__future__"), None)
    if first is None:
        return body[:block.stop] + [stmt] + body[block.stop:]
    return _insert(body, first, stmt, own_group=True)


def _dotted(stmt: cst.BaseStatement) -> str:
    """The dotted module an import statement names (``os.path``; the first of several), "" for anything else."""
    small = stmt.body[0] if isinstance(stmt, cst.SimpleStatementLine) and stmt.body else None
    node = small.names[0].name if isinstance(small, cst.Import) else small.module \
        if isinstance(small, cst.ImportFrom) and small.module is not None else None
    if node is None:
        return ""
    parts = []
    while isinstance(node, cst.Attribute):
        parts.append(node.attr.value)
        node = node.value
    return ".".join([node.value] + parts[::-1]) if isinstance(node, cst.Name) else ""


def _with_torch_from_import(body: list, line: str) -> list:
    """``body`` with ``line`` (``from torch.... import ...``) among the file's ``from torch`` imports in isort's
    order, else after its last torch import, else after all its imports."""
    stmt = cst.parse_statement(line + "\n")
    mod = _dotted(stmt)
    block = _import_block(body)
    torch_imports = [k for k in block if _import_root(body[k]) == "torch"]
    later = [k for k in torch_imports if isinstance(body[k].body[0], cst.ImportFrom) and _dotted(body[k]) > mod]
    if later:
        return _insert(body, later[0], stmt)
    at = torch_imports[-1] + 1 if torch_imports else block.stop
    return body[:at] + [stmt] + body[at:]


def _ddp_pass(module: cst.Module, edits: list[Edit]) -> tuple[str, list[Edit], list[tuple[Edit, str]], list[Edit]]:
    """Make the DDP edits of ``edits``; the others come back with their lines moved to where their text now is.

    - ``no_sync``: at the ``backward()`` statement on ``line`` (``params``: ``name``, the DDP model's variable
      there; ``step``, the line of the optimizer's ``step()``; ``forward``, the model's forward lines), the
      statements from the forward call's through that one wrapped in ``with NAME.no_sync() if <not cond> else
      contextlib.nullcontext():``, where ``cond`` is the condition of the ``if`` after it, in the same block, that
      holds the step: the micro-steps that do not step skip the all-reduce, the one that does synchronises;
      ``import contextlib`` joins the file's standard-library imports as isort orders them;
    - ``ddp_keywords``: ``params["values"]`` set in the ``DistributedDataParallel(...)`` call on ``line``
      (found by its qualified name, however imported);
    - ``comm_hook``: ``NAME.register_comm_hook(None, default_hooks.<dtype>_compress_hook)`` after the statement
      ``NAME = DistributedDataParallel(...)`` on ``line`` (``params["dtype"]``: "bf16" or "fp16"), with
      :data:`COMM_HOOKS_IMPORT` among the file's ``from torch`` imports.

    Returns
    -------
    (str, list of Edit, list of (Edit, str), list of Edit)
        The new text, the DDP edits made, those not made with the reason, and the other edits (lines mapped).
    """
    mine = [e for e in edits if e.kind in DDP_KINDS]
    rest = [e for e in edits if e.kind not in DDP_KINDS]
    editor = _DDPEditor(module, mine)
    new = MetadataWrapper(module).visit(editor).code
    made = [e for i, e in enumerate(mine) if i in editor.done]
    where = {"no_sync": "no backward() statement of its own on that line",
             "ddp_keywords": "no DistributedDataParallel(...) call starts on that line",
             "comm_hook": "no DistributedDataParallel(...) statement of its own on that line"}
    skipped = [(e, f"{editor.why.get(i) or where[e.kind]} (line {e.line})") for i, e in enumerate(mine)
               if i not in editor.done]
    return new, made, skipped, _follow_lines(module.code, new, rest)
