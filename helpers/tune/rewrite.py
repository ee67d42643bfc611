"""Write tune's measured winners into the user's source, at the call sites captured while the script ran.

The edits are made with libcst (a concrete syntax tree: the user's formatting and comments stay as they were),
each at a file and line that :mod:`helpers.tune.hook` took from the running frames:

- ``loader``: keyword arguments of the ``DataLoader(...)`` call on that line set or replaced
  (``num_workers=2``, ``persistent_workers=True``, ``pin_memory=True``);
- ``non_blocking``: ``non_blocking=True`` added to the ``.to(...)`` / ``.cuda(...)`` calls on that line;
- ``autocast``: the statement holding the model's forward call wrapped in
  ``with torch.autocast(device_type=..., dtype=torch.bfloat16):`` (the PyTorch AMP recipe's form);
- ``channels_last``: ``model = model.to(memory_format=torch.channels_last)`` inserted before the statement that
  builds the optimizer (the model's parameters keep their identity, so the optimizer is unaffected either way);
  for a model wrapped in ``DistributedDataParallel`` (``params["wrap_arg"]``), the module passed to that call on
  the line becomes ``module.to(memory_format=torch.channels_last)`` instead, so that DDP's gradient buckets take
  the channels_last strides;
- ``cudnn_benchmark``: ``torch.backends.cudnn.benchmark = True`` inserted before that same statement;
- ``compile``: ``params["code"]`` (``model.compile()``,
  :func:`helpers.tune.candidates_compile.compile_edits`) inserted before that same statement;
- ``prefetch``: the ``for`` loop over the DataLoader on that line made ``for ... in prefetch(<loader>, <device>):``
  (``params["device"]``: an expression for the model's device, valid at the loop), and notebook 05's side-stream
  prefetcher (:data:`helpers.pipeline.side_stream.SOURCE`) added after the file's imports, with the imports it needs
  (:data:`helpers.pipeline.side_stream.IMPORTS`) where the file lacks them. Where the file already uses one of its
  names anywhere (or has a star import), or no device expression was found, the edit is skipped with that reason;
- ``grad_scaler`` (with a float16 ``autocast`` edit): the PyTorch AMP recipe's loss scaling, as notebook 06 shows it:
  ``grad_scaler = torch.amp.GradScaler("<device>")`` after the file's imports, ``loss.backward()`` made
  ``grad_scaler.scale(loss).backward()`` on each line of ``params["backward"]``, ``grad_scaler.unscale_(optimizer)``
  inserted before each gradient clip (``params["clip"]``), and the ``optimizer.step()`` statement on the edit's
  line made ``grad_scaler.step(optimizer)`` followed by ``grad_scaler.update()``. Every one of these lines, and the
  float16 autocast, is written, or none is: a scaled loss without its unscaled step would train wrongly;
- ``argparse_default``: the ``default=`` of the ``add_argument(...)`` call on that line set. A ``loader`` keyword
  whose value in the call is the script's own option (``num_workers=args.workers``) is written there, as the
  option's new default, and the keywords that need workers follow that value
  (``persistent_workers=args.workers > 0``); a value from any other variable or expression is left as it is and
  returned as skipped, with the keyword to set where it comes from;
- ``call_keywords``: keyword arguments of a framework's call on that line set or replaced, for settings a
  framework owns (:func:`framework_calls` finds those calls: Lightning's ``Trainer(precision=...)``,
  transformers' ``TrainingArguments(bf16=..., dataloader_num_workers=...)``, accelerate's
  ``Accelerator(mixed_precision=...)``).

``import torch`` is added where an edit needs it and the file lacks it. An edit that cannot be placed (the line
holds no such call, the statement shares its line with a compound statement's header) is returned as skipped
with its reason, never guessed.
"""

from __future__ import annotations

import difflib
import sys
from typing import Any, Sequence

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider, QualifiedNameProvider

from helpers.errors import ParameterError

from helpers.tune.rewrite_common import (DDP_KINDS, DDP_NAMES, Code, Edit, _after_imports, _import_root, _imports,
                                         _fit_call, _names_used, _set_keywords, line_limit)
from helpers.tune.rewrite_cpu import CPU_KINDS, threads_pass
from helpers.tune.rewrite_ddp import _ddp_pass
from helpers.tune.rewrite_device import DEVICE_KINDS, _device_pass

__all__ = ["Edit", "apply_edits", "float16_part", "framework_calls", "loader_elsewhere", "loader_label",
           "techniques_of", "unified_diff"]

KINDS = ("loader", "non_blocking", "autocast", "channels_last", "cudnn_benchmark", "call_keywords",
         "argparse_default", "prefetch", "grad_scaler", "debug_off", "no_grad", "no_sync", "ddp_keywords",
         "comm_hook", "compile", *CPU_KINDS, *DEVICE_KINDS)
#: The variable the ``grad_scaler`` edit binds at the top of a file.
SCALER = "grad_scaler"
#: The names the ``prefetch`` edit defines at the top of a file (helpers.pipeline.side_stream's functions).
PREFETCH_NAMES = ("side_stream", "copy_batch", "prefetch")

#: The framework calls that own the DataLoader or the precision, by the qualified names a script reaches them by
#: (the frameworks' documented imports): framework, the call's name.
FRAMEWORK_CALLS = {
    "lightning.Trainer": ("lightning", "Trainer"),
    "lightning.pytorch.Trainer": ("lightning", "Trainer"),
    "pytorch_lightning.Trainer": ("pytorch_lightning", "Trainer"),
    "transformers.TrainingArguments": ("transformers", "TrainingArguments"),
    "transformers.Seq2SeqTrainingArguments": ("transformers", "Seq2SeqTrainingArguments"),
    "accelerate.Accelerator": ("accelerate", "Accelerator"),
}


def _name_of(func: cst.BaseExpression) -> str:
    if isinstance(func, cst.Name):
        return func.value
    if isinstance(func, cst.Attribute):
        return func.attr.value
    return ""


def _channels_last_arg(call: cst.Call) -> cst.Call | None:
    """``call`` with its module argument (the first positional, or ``module=``) converted to channels_last; None
    when it has none."""
    args = list(call.args)
    for i, a in enumerate(args):
        if (a.keyword is None and not a.star) or (a.keyword is not None and a.keyword.value == "module"):
            v = a.value
            if not isinstance(v, (cst.Name, cst.Attribute, cst.Call, cst.Subscript)):
                v = v.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
            to = cst.Call(func=cst.Attribute(value=v, attr=cst.Name("to")), args=[cst.Arg(
                keyword=cst.Name("memory_format"), value=cst.parse_expression("torch.channels_last"),
                equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""),
                                      whitespace_after=cst.SimpleWhitespace("")))])
            args[i] = a.with_changes(value=to)
            return call.with_changes(args=args)
    return None


#: The calls the ``debug_off`` edit removes or unwraps, by the name they are called by (torch.autograd's).
DEBUG_CALLS = {"set_detect_anomaly": "set_detect_anomaly", "detect_anomaly": "detect_anomaly",
               "gradcheck": "gradcheck", "gradgradcheck": "gradgradcheck"}
#: Calls that make a loop a training loop (``loss.backward()``, ``optimizer.step()``, ``optimizer.zero_grad()``,
#: ``accelerator.backward(loss)``): the ``no_grad`` edit never wraps a loop that holds one.
TRAINING_CALLS = ("backward", "step", "zero_grad")


def _holds_training_call(node: cst.CSTNode) -> bool:
    found = []

    class Calls(cst.CSTVisitor):
        def visit_Call(self, call: cst.Call) -> None:
            if _name_of(call.func) in TRAINING_CALLS:
                found.append(call)

    node.visit(Calls())
    return bool(found)


def _is_true(node: cst.BaseExpression) -> bool:
    return isinstance(node, cst.Name) and node.value == "True"


class _GeneralEdits:
    """The ``debug_off`` and ``no_grad`` edits, as methods of :class:`_Editor` (statements removed, unwrapped or
    wrapped in ``with torch.no_grad():``). ``general_why`` holds, by edit index, why one could not be made."""

    def _general_prepare(self, module: cst.Module) -> None:
        """For each ``no_grad`` edit, the statement to wrap, by its start (line, column): the outermost ``for`` or
        ``while`` loop around the forward call, inside the same function, that holds no ``backward()``,
        ``step()`` or ``zero_grad()`` call (a validation loop); else the statement of the forward call itself."""
        self.general_targets: dict[int, tuple[int, int]] = {}
        self.general_why: dict[int, str] = {}
        self._carry: list[cst.EmptyLine] = []
        lines = {i: e.line for i, e in enumerate(self.edits) if e.kind == "no_grad"}
        if not lines:
            return
        chains: dict[int, list[cst.CSTNode]] = {}
        pos = self._span
        stack: list[cst.CSTNode] = []

        class Chains(cst.CSTVisitor):
            def on_visit(self, node: cst.CSTNode) -> bool:
                if isinstance(node, (cst.BaseCompoundStatement, cst.SimpleStatementLine)):
                    start, end = pos(node)
                    inside = [i for i, n in lines.items() if start <= n <= end]
                    if not inside:
                        return False
                    stack.append(node)
                    for i in inside:
                        chains[i] = list(stack)
                    return not isinstance(node, cst.SimpleStatementLine)
                return True

            def on_leave(self, node: cst.CSTNode) -> None:
                if stack and stack[-1] is node:
                    stack.pop()

        module.visit(Chains())
        for i, chain in chains.items():
            if not chain or not isinstance(chain[-1], cst.SimpleStatementLine):
                self.general_why[i] = ("the forward call is in a compound statement's header (a for, if or with "
                                       "line): wrap it in torch.no_grad() by hand")
                continue
            defs = [k for k, n in enumerate(chain) if isinstance(n, (cst.FunctionDef, cst.ClassDef))]
            own = chain[defs[-1] + 1 if defs else 0:]
            loop = next((n for n in own if isinstance(n, (cst.For, cst.While)) and not _holds_training_call(n)),
                        None)
            target = loop if loop is not None else chain[-1]
            p = self.get_metadata(PositionProvider, target).start
            self.general_targets[i] = (p.line, p.column)
        spans = {i: self._span_of_start(module, t) for i, t in self.general_targets.items()}
        for i, (start, end) in spans.items():  # a statement inside another target is covered by that one's with
            if any(j != i and s <= start and end <= e and (s, e) != (start, end) for j, (s, e) in spans.items()):
                self.general_targets[i] = (-1, -1)
                self.done.add(i)

    def _span_of_start(self, module: cst.Module, start: tuple[int, int]) -> tuple[int, int]:
        found = []
        pos = self.get_metadata

        class Find(cst.CSTVisitor):
            def on_visit(self, node: cst.CSTNode) -> bool:
                if found:
                    return False
                if isinstance(node, (cst.BaseCompoundStatement, cst.SimpleStatementLine)):
                    p = pos(PositionProvider, node)
                    if (p.start.line, p.start.column) == start:
                        found.append((p.start.line, p.end.line))
                        return False
                return True

        module.visit(Find())
        return found[0] if found else (start[0], start[0])

    def _general(self, orig: cst.BaseStatement, stmt: cst.BaseStatement) -> list[cst.BaseStatement]:
        """``stmt`` (the edited form of ``orig``) as the statements that replace it in its block."""
        out = [stmt]
        p = self.get_metadata(PositionProvider, orig)
        start, end = p.start.line, p.end.line
        for i, e in enumerate(self.edits):
            if i in self.done or not out:
                continue
            if e.kind == "no_grad" and self.general_targets.get(i) == (start, p.start.column):
                self.done.update(j for j, t in self.general_targets.items() if t == (start, p.start.column))
                body = out[0]
                out = [cst.With(items=[cst.WithItem(item=cst.parse_expression("torch.no_grad()"))],
                                body=cst.IndentedBlock(body=[body.with_changes(leading_lines=[])]),
                                leading_lines=body.leading_lines)]
                self.needs_torch = True
            elif e.kind == "debug_off" and start <= e.line <= end:
                out = self._debug_off(i, e, orig, out[0])
        if out and self._carry:
            out[0] = out[0].with_changes(leading_lines=_merged_lines(self._carry, out[0].leading_lines))
            self._carry = []
        return out

    def _debug_off(self, i: int, e: Edit, orig: cst.BaseStatement,
                   stmt: cst.BaseStatement) -> list[cst.BaseStatement]:
        """A debugging API's statement removed (``set_detect_anomaly(True)``, ``gradcheck(...)``) or its ``with``
        unwrapped (``detect_anomaly()``); ``[stmt]`` with the reason in ``general_why`` where it cannot be."""
        api = e.params.get("api", "")
        if not isinstance(orig, (cst.With, cst.SimpleStatementLine)):  # a loop or a def around the line
            return [stmt]
        if isinstance(orig, cst.With):
            items = [k for k, it in enumerate(orig.items) if isinstance(it.item, cst.Call)
                     and _name_of(it.item.func) in ("detect_anomaly", "set_detect_anomaly")
                     and self._span(it.item)[0] == e.line]
            if not items:
                return [stmt]
            k = items[0]
            call = orig.items[k].item
            if _name_of(call.func) == "set_detect_anomaly" and not (call.args and _is_true(call.args[0].value)):
                self.general_why[i] = ("its mode is not the literal True: set it False where it comes from (or "
                                       "run without that option)")
                return [stmt]
            if orig.items[k].asname is not None:
                self.general_why[i] = "the with statement binds its context manager (as ...): remove it by hand"
                return [stmt]
            self.done.add(i)
            if len(stmt.items) > 1:
                rest = [it for n, it in enumerate(stmt.items) if n != k]
                rest[-1] = rest[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
                return [stmt.with_changes(items=rest)]
            body = stmt.body
            inner = list(body.body) if isinstance(body, cst.IndentedBlock) else \
                [cst.SimpleStatementLine(body=list(body.body))]
            inner[0] = inner[0].with_changes(leading_lines=[*stmt.leading_lines, *inner[0].leading_lines])
            return inner
        if not isinstance(orig, cst.SimpleStatementLine) or len(orig.body) != 1:
            self.general_why[i] = f"{api}(...) shares its line with other statements: remove it by hand"
            return [stmt]
        small = orig.body[0]
        call = small.value if isinstance(small, cst.Expr) else small.test if isinstance(small, cst.Assert) else None
        if not isinstance(call, cst.Call) or _name_of(call.func) not in DEBUG_CALLS:
            self.general_why[i] = (f"the result of {api}(...) is used (assigned or tested): remove it by hand"
                                   if api.startswith("grad") else f"{api}(...) is not a statement of its own")
            return [stmt]
        if _name_of(call.func) == "set_detect_anomaly":
            mode = next((a.value for a in call.args if a.keyword is None or a.keyword.value == "mode"), None)
            if mode is None or not _is_true(mode):
                self.general_why[i] = ("its mode is not the literal True: set it False where it comes from (or run "
                                       "without that option)")
                return [stmt]
        self.done.add(i)
        self._carry += [ln for ln in stmt.leading_lines]
        return []


class _Editor(_GeneralEdits, cst.CSTTransformer):
    METADATA_DEPENDENCIES = (PositionProvider, QualifiedNameProvider)

    def __init__(self, edits: Sequence[Edit], source: str = "") -> None:
        super().__init__()
        self.edits = list(edits)
        self.lines = source.splitlines()  # the user's lines: a call grown past the file's line limit is wrapped
        self.limit = line_limit(source)
        self.done: set[int] = set()
        self.needs_torch = False
        self.prefetcher = False  # a loop was wrapped: the module gets side_stream.SOURCE
        self.parts: dict[int, set[tuple[str, int]]] = {}  # grad_scaler edits: the lines placed so far
        self.scaler_device = ""  # a grad_scaler edit was placed: the module binds SCALER

    def _part(self, i: int, part: str, line: int) -> None:
        self.parts.setdefault(i, set()).add((part, line))

    def complete(self, i: int) -> bool:
        """Whether grad_scaler edit ``i`` has every one of its lines placed."""
        e = self.edits[i]
        want = {("step", e.line)} | {("backward", n) for n in e.params.get("backward") or []} \
            | {("clip", n) for n in e.params.get("clip") or []}
        return bool(e.params.get("backward")) and want <= self.parts.get(i, set())

    def _span(self, node) -> tuple[int, int]:
        pos = self.get_metadata(PositionProvider, node)
        return pos.start.line, pos.end.line

    # ---------------------------------------------------------------- calls: loader, non_blocking

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        start, end = self._span(original)
        name = _name_of(original.func)
        keyworded = False  # keywords were added: the call may now run past the file's line limit
        for i, e in enumerate(self.edits):
            if e.kind == "loader" and start == e.line and name.endswith("DataLoader"):
                updated = _set_keywords(updated, e.params)
                self.done.add(i)
                keyworded = True
            elif e.kind == "non_blocking" and start <= e.line <= end and name in ("to", "cuda") \
                    and isinstance(original.func, cst.Attribute):
                updated = _set_keywords(updated, {"non_blocking": True})
                self.done.add(i)
            elif e.kind == "argparse_default" and start == e.line and name == "add_argument":
                updated = _set_keywords(updated, {"default": e.params["value"]})
                self.done.add(i)
            elif e.kind == "call_keywords" and start == e.line and name == e.params.get("call"):
                updated = _set_keywords(updated, e.params.get("values") or {}, e.params.get("positional") or ())
                self.done.add(i)
                keyworded = True
            elif e.kind == "grad_scaler" and name == "backward" and isinstance(original.func, cst.Attribute) \
                    and start in (e.params.get("backward") or []) and SCALER not in self.taken_scaler:
                loss = updated.func.value  # "(loss / 2).backward()": its parentheses are the call's now
                loss = loss.with_changes(lpar=[], rpar=[]) if getattr(loss, "lpar", None) else loss
                scaled = cst.Call(func=cst.parse_expression(f"{SCALER}.scale"), args=[cst.Arg(loss)])
                updated = updated.with_changes(func=updated.func.with_changes(value=scaled))
                self._part(i, "backward", start)
            elif e.kind == "channels_last" and e.params.get("wrap_arg") and start == e.line and i not in self.done \
                    and {q.name for q in self.get_metadata(QualifiedNameProvider, original.func, set())} & DDP_NAMES:
                wrapped = _channels_last_arg(updated)
                if wrapped is not None:
                    updated = wrapped
                    self.done.add(i)
                    self.needs_torch = True
        if keyworded and start == end and start <= len(self.lines) and isinstance(updated, cst.Call):
            updated = _fit_call(updated, self.lines[start - 1], cst.Module([]).code_for_node(original), self.limit)
        return updated

    # ---------------------------------------------------------------- loops: prefetch

    def leave_For(self, original: cst.For, updated: cst.For) -> cst.For:
        start, end = self._span(original.iter)
        for i, e in enumerate(self.edits):
            if e.kind == "prefetch" and start <= e.line <= end and e.params.get("device") and i not in self.done \
                    and not self.taken:
                call = cst.Call(func=cst.Name("prefetch"), args=[
                    cst.Arg(updated.iter, comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))),
                    cst.Arg(cst.parse_expression(e.params["device"]))])
                updated = updated.with_changes(iter=call)
                self.done.add(i)
                self.needs_torch = self.prefetcher = True
        return updated

    # ---------------------------------------------------------------- statements: autocast, channels_last

    def _edit_block(self, original: Sequence[cst.BaseStatement],
                    body: Sequence[cst.BaseStatement]) -> list[cst.BaseStatement]:
        out: list[cst.BaseStatement] = []
        for orig, stmt in zip(original, body):
            if not isinstance(stmt, cst.SimpleStatementLine):
                out.extend(self._general(orig, stmt))
                continue
            start, end = self._span(orig)
            wrapped = stmt
            for i, e in enumerate(self.edits):
                if e.kind == "grad_scaler" and e.params.get("optimizer") and SCALER not in self.taken_scaler:
                    wrapped = self._scaler_lines(i, e, start, end, wrapped, out)
                    continue
                if i in self.done or not start <= e.line <= end:
                    continue
                if e.kind in ("channels_last", "cudnn_benchmark", "compile") and not e.params.get("wrap_arg"):
                    name = e.params.get("name", "model")
                    code = ("torch.backends.cudnn.benchmark = True" if e.kind == "cudnn_benchmark" else
                            e.params["code"] if e.kind == "compile" else
                            f"{name} = {name}.to(memory_format=torch.channels_last)" if e.params.get("assign", True)
                            else f"{name}.to(memory_format=torch.channels_last)")
                    line = cst.parse_statement(code + "\n")
                    out.append(line.with_changes(leading_lines=wrapped.leading_lines))  # the comments go first
                    wrapped = wrapped.with_changes(leading_lines=[])
                    self.done.add(i)
                    self.needs_torch = True
                elif e.kind == "autocast":
                    dev, dtype = e.params.get("device_type", "cpu"), e.params.get("dtype", "bfloat16")
                    with_ = cst.With(
                        items=[cst.WithItem(item=cst.parse_expression(
                            f"torch.autocast(device_type={dev!r}, dtype=torch.{dtype})".replace("'", '"')))],
                        body=cst.IndentedBlock(body=[wrapped.with_changes(leading_lines=[])]),
                        leading_lines=wrapped.leading_lines)
                    self.done.add(i)
                    self.needs_torch = True
                    wrapped = with_
            out.extend(self._general(orig, wrapped))
        self._carry = []  # a removed statement's comments stay in its own block
        return out or [cst.SimpleStatementLine(body=[cst.Pass()])]

    def _scaler_lines(self, i: int, e: Edit, start: int, end: int, stmt: cst.SimpleStatementLine,
                      out: list[cst.BaseStatement]) -> cst.BaseStatement:
        """A grad_scaler edit's statements: ``unscale_`` before a clip on these lines; the step made
        ``grad_scaler.step(optimizer)``, ``grad_scaler.update()`` appended to ``out`` after it."""
        opt = e.params["optimizer"]
        for n in e.params.get("clip") or []:
            if start <= n <= end and ("clip", n) not in self.parts.get(i, set()):
                out.append(cst.parse_statement(f"{SCALER}.unscale_({opt})\n").with_changes(
                    leading_lines=stmt.leading_lines))
                stmt = stmt.with_changes(leading_lines=[])
                self._part(i, "clip", n)
        if not start <= e.line <= end or len(stmt.body) != 1 or not isinstance(stmt.body[0], cst.Expr):
            return stmt
        call = stmt.body[0].value
        plain = isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute) and call.func.attr.value == "step"
        if not plain or call.args:  # with arguments (LBFGS's closure): GradScaler.step does not take them
            return stmt
        new = cst.Call(func=cst.parse_expression(f"{SCALER}.step"), args=[cst.Arg(call.func.value)])
        out.append(stmt.with_changes(body=[stmt.body[0].with_changes(value=new)]))
        self._part(i, "step", e.line)
        self.needs_torch = True
        self.scaler_device = e.params.get("device_type", "cuda")
        return cst.parse_statement(f"{SCALER}.update()\n")

    def leave_IndentedBlock(self, original: cst.IndentedBlock, updated: cst.IndentedBlock) -> cst.IndentedBlock:
        return updated.with_changes(body=self._edit_block(original.body, updated.body))

    def visit_Module(self, node: cst.Module) -> None:
        names = _names_used(node)
        self.taken = names & (set(PREFETCH_NAMES) | {"*"})  # a name of the prefetcher's the file uses already
        self.taken_scaler = names & {SCALER, "*"}
        self._general_prepare(node)

    def leave_Module(self, original: cst.Module, updated: cst.Module) -> cst.Module:
        body = self._edit_block(original.body, updated.body)
        at = _after_imports(body) if not self.scaler_device else _after_last_import(body)
        wanted = ["torch"] * self.needs_torch
        if self.prefetcher:  # imports torch: only where a loop is wrapped (tune's command line refuses bad flags fast)
            from helpers.pipeline import side_stream

            wanted = list(side_stream.IMPORTS) + wanted
        new_imports = [m for m in dict.fromkeys(wanted) if not _imports(original, m)]
        std = [cst.parse_statement(f"import {m}\n") for m in new_imports if m in sys.stdlib_module_names]
        added = [cst.parse_statement(f"import {m}\n") for m in new_imports if m not in sys.stdlib_module_names]
        if self.scaler_device:
            added.append(cst.parse_statement(f'{SCALER} = torch.amp.GradScaler("{self.scaler_device}")  # float16 '
                                             f'needs its loss scaled (the workbook\'s notebook 06)\n').with_changes(
                leading_lines=[cst.EmptyLine()] if at else []))
        if self.prefetcher:  # notebook 05's functions, two blank lines before each (PEP 8)
            two = [cst.EmptyLine(), cst.EmptyLine()]
            added += [stmt.with_changes(leading_lines=two + [ln for ln in stmt.leading_lines if ln.comment])
                      for stmt in cst.parse_module("pass\n" + side_stream.SOURCE).body[1:]]  # its comment kept
            if at < len(body) and len(body[at].leading_lines) < 2:
                body[at] = body[at].with_changes(leading_lines=two)
        std_at = _stdlib_imports_end(body) if std else at  # the standard library's imports first, as isort has them
        if std and std_at < len(body) and _import_root(body[std_at]) not in ("", *sys.stdlib_module_names) \
                and not body[std_at].leading_lines:
            body[std_at] = body[std_at].with_changes(leading_lines=[cst.EmptyLine()])  # then the third-party group
        return updated.with_changes(body=body[:std_at] + std + body[std_at:at] + added + body[at:])


def _taken_text(taken: Sequence[str], what: str) -> str:
    """Why an edit that adds ``what`` was not made: the names of its the file uses already."""
    if "*" in taken:
        return f"the file has a star import (from ... import *), which may bind a name {what} needs"
    return f"the file already uses the name{'s' if len(taken) > 1 else ''} {', '.join(taken)}"


def _stdlib_imports_end(body: Sequence[cst.BaseStatement]) -> int:
    """Where a new standard-library import goes: after the last one of the leading import block (``__future__``
    aside), else at the start of that block (after the docstring and any ``from __future__`` import)."""
    end = _after_imports(body)
    start = 1 if body and isinstance(body[0], cst.SimpleStatementLine) and not _import_root(body[0]) \
        and isinstance(body[0].body[0], cst.Expr) else 0
    at = start
    for i in range(start, end):
        root = _import_root(body[i])
        if root == "__future__" or root in sys.stdlib_module_names:
            at = i + 1
    return at


def _after_last_import(body: Sequence[cst.BaseStatement]) -> int:
    """The index after the module's last top-level import statement, wherever it is (a script may set
    ``os.environ`` between its imports): a statement that runs at import time and uses torch goes there."""
    last = _after_imports(body)
    for i, stmt in enumerate(body):
        if isinstance(stmt, cst.SimpleStatementLine) and any(isinstance(x, (cst.Import, cst.ImportFrom))
                                                             for x in stmt.body):
            last = max(last, i + 1)
    return last


def apply_edits(source: str, edits: Sequence[Edit], *,
                passed: Sequence[str] = ()) -> tuple[str, list[Edit], list[tuple[Edit, str]]]:
    """Apply the edits of one file to its source.

    Parameters
    ----------
    source : str
        The file's text.
    edits : sequence of Edit
        Edits of this file (their ``file`` is not read).
    passed : sequence of str
        The arguments the script is run with: an option they set (``--workers 0``, ``--workers=0``) overrides
        its default, so a value is not written there; it is returned as skipped, with the argument to pass.

    Returns
    -------
    (str, list of Edit, list of (Edit, str))
        The new text, the edits made, and each edit not made with its reason.

    Raises
    ------
    ParameterError
        On an unknown edit kind, or a source that does not parse (libcst's message).
    """
    for e in edits:
        if e.kind not in KINDS:
            raise ParameterError(f"rewrite: unknown edit kind {e.kind!r}; allowed: {', '.join(KINDS)}")
    cpu = [e for e in edits if e.kind in CPU_KINDS]
    if cpu:  # the threads' line after the imports, once the others' edits are made at their captured lines
        rest = [e for e in edits if e.kind not in CPU_KINDS]
        new, made, skipped = apply_edits(source, rest, passed=passed) if rest else (source, [], [])
        new, cpu_made, cpu_skipped = threads_pass(new, cpu)
        return new, made + cpu_made, skipped + cpu_skipped
    try:
        module = cst.parse_module(source)
    except cst.ParserSyntaxError as exc:
        raise ParameterError(f"rewrite: the file does not parse: {exc}") from None
    if any(e.kind in DEVICE_KINDS for e in edits):  # the CUDA/NPU edits first (helpers.tune.rewrite_device)
        source, dev_made, dev_skipped, edits = _device_pass(module, list(edits))
        new, made, skipped = apply_edits(source, edits, passed=passed) if edits else (source, [], [])
        return new, dev_made + made, dev_skipped + skipped
    if any(e.kind in DDP_KINDS for e in edits):  # DDP's edits first; the others' lines follow the text they moved
        source, ddp_made, ddp_skipped, edits = _ddp_pass(module, list(edits))
        module = cst.parse_module(source)
        new, made, skipped = apply_edits(source, edits, passed=passed) if edits else (source, [], [])
        return new, ddp_made + made, ddp_skipped + skipped
    edits, options_skipped = _through_options(module, list(edits), passed)
    edits = _with_step_receivers(module, edits)
    editor = _Editor(edits, source)
    new = MetadataWrapper(module).visit(editor)
    broken = [i for i, e in enumerate(edits) if float16_part(e)
              and not (editor.complete(i) if e.kind == "grad_scaler" else i in editor.done)]
    group_skipped: list[tuple[Edit, str]] = []
    if broken:  # float16 goes with its whole GradScaler, or neither is written
        why = "; ".join(_scaler_reason(edits[i], editor, module) for i in broken)
        group = [i for i, e in enumerate(edits) if float16_part(e)]
        group_skipped = [(edits[i], f"float16 autocast and its GradScaler are written together or not at all: {why}")
                         for i in group]
        edits = [e for i, e in enumerate(edits) if i not in group]
        editor = _Editor(edits, source)
        new = MetadataWrapper(module).visit(editor)
    for i, e in enumerate(edits):
        if e.kind == "grad_scaler" and editor.complete(i):
            editor.done.add(i)
    made = [e for i, e in enumerate(edits) if i in editor.done]
    reasons = {"loader": "no DataLoader(...) call starts on that line",
               "non_blocking": "no .to(...) or .cuda(...) call on that line",
               "autocast": "the forward call is not a statement of its own line (it shares a compound statement's "
                           "header line)",
               "channels_last": "the optimizer's construction is not a statement of its own line (or, for a "
                                "model in DistributedDataParallel, no such call with a module starts on that line)",
               "cudnn_benchmark": "the optimizer's construction is not a statement of its own line",
               "compile": "the optimizer's construction is not a statement of its own line",
               "call_keywords": "no {call}(...) call starts on that line"}
    reasons["argparse_default"] = "no add_argument(...) call starts on that line"
    reasons["grad_scaler"] = "its lines could not all be placed"
    reasons["debug_off"] = "no such call is a statement of its own on that line"
    reasons["no_grad"] = "the forward call's statement could not be found"
    taken = sorted(_names_used(module) & (set(PREFETCH_NAMES) | {"*"}))
    reasons["prefetch"] = (
        _taken_text(taken, "notebook 05's prefetcher") + ": rename yours, or add notebook 05's three functions "
        "under other names by hand" if taken else "no for loop over the DataLoader on that line")
    why = editor.general_why  # the debug_off and no_grad edits' own reasons
    skipped = options_skipped + group_skipped + [(e, f"{why.get(i) or _reason(e, reasons)} (line {e.line})")
                                                 for i, e in enumerate(edits) if i not in editor.done]
    return new.code, made, skipped


def float16_part(e: Edit) -> bool:
    """Whether ``e`` is one of float16's edits (its autocast, its GradScaler): written together or not at all."""
    return e.kind == "grad_scaler" or (e.kind == "autocast" and e.params.get("dtype") == "float16")


def _with_step_receivers(module: cst.Module, edits: list[Edit]) -> list[Edit]:
    """``edits`` with each grad_scaler edit's ``optimizer`` param set: the code of the object whose ``.step(...)`` is
    called on its line (``opt`` in ``opt.step()``), or "" where there is no such call."""
    if not any(e.kind == "grad_scaler" for e in edits):
        return edits
    steps: dict[int, str] = {}

    class Steps(cst.CSTVisitor):
        METADATA_DEPENDENCIES = (PositionProvider,)

        def visit_Call(self, node: cst.Call) -> None:
            if isinstance(node.func, cst.Attribute) and node.func.attr.value == "step":
                steps.setdefault(self.get_metadata(PositionProvider, node).start.line,
                                 module.code_for_node(node.func.value).strip())

    MetadataWrapper(module).visit(Steps())
    return [Edit(e.kind, e.file, e.line, {**e.params, "optimizer": steps.get(e.line, "")}, e.technique)
            if e.kind == "grad_scaler" else e for e in edits]


def _scaler_reason(e: Edit, editor: _Editor, module: cst.Module) -> str:
    """Why a float16 edit (its autocast or its GradScaler) was not placed whole."""
    if e.kind == "autocast":
        return f"the forward call on line {e.line} is not a statement of its own line"
    taken = sorted(_names_used(module) & {SCALER, "*"})
    if taken:
        return _taken_text(taken, "the GradScaler")
    placed = editor.parts.get(editor.edits.index(e), set())
    if not e.params.get("optimizer") or ("step", e.line) not in placed:
        return (f"the optimizer's step() on line {e.line} is not a plain optimizer.step() statement on a line of its "
                f"own (it shares the line, is part of a one-line if, or takes arguments)")
    if not e.params.get("backward"):
        return "no loss.backward() was seen"
    missing = [f"backward() on line {n}" for n in e.params["backward"] if ("backward", n) not in placed]
    missing += [f"the clip on line {n}" for n in e.params.get("clip") or [] if ("clip", n) not in placed]
    return f"{', '.join(missing) or 'a line'} could not be changed"


def _reason(e: Edit, reasons: dict[str, str]) -> str:
    """Why ``e`` was not made."""
    if e.kind == "prefetch" and not e.params.get("device"):
        return ("no variable at the loop holds the model's device, nor is the model in scope there: wrap the loop "
                "as prefetch(loader, device) by hand")
    return reasons[e.kind].format(call=e.params.get("call"))


#: DataLoader keywords that torch accepts only with workers, and their value where the workers are an option's.
_NEEDS_WORKERS = {"persistent_workers": "{n} > 0", "prefetch_factor": "{v} if {n} > 0 else None"}
#: The technique each DataLoader keyword belongs to (an edit's label names only what it writes).
_TECHNIQUE = {"num_workers": "num_workers", "persistent_workers": "num_workers", "prefetch_factor": "prefetch_factor",
              "pin_memory": "pin_memory"}


def loader_label(keys: Sequence[str], fallback: str = "") -> str:
    """The techniques a ``loader`` edit of these keywords writes, as its label: ``"num_workers + pin_memory"``."""
    names = list(dict.fromkeys(_TECHNIQUE[k] for k in keys if k in _TECHNIQUE))
    return " + ".join(names) or fallback


def techniques_of(edits: Sequence[Edit]) -> set[str]:
    """The techniques some of ``edits`` write (their labels split)."""
    return {t for e in edits for t in e.technique.split(" + ") if t}


class _Options(cst.CSTVisitor):
    """The script's argparse options (``add_argument`` calls: dest, line, literal default, action) and the keyword
    values of its ``DataLoader(...)`` calls, by line."""

    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self, module: cst.Module) -> None:
        super().__init__()
        self.module = module
        self.options: dict[str, list[dict[str, Any]]] = {}
        self.loaders: dict[int, dict[str, cst.BaseExpression]] = {}

    def visit_Call(self, node: cst.Call) -> None:
        line = self.get_metadata(PositionProvider, node).start.line
        name = _name_of(node.func)
        if name.endswith("DataLoader"):
            self.loaders.setdefault(line, {a.keyword.value: a.value for a in node.args if a.keyword is not None})
        if name != "add_argument" or not isinstance(node.func, cst.Attribute):
            return
        flags = [a.value.evaluated_value for a in node.args
                 if a.keyword is None and isinstance(a.value, cst.SimpleString)]
        kw = {a.keyword.value: a.value for a in node.args if a.keyword is not None}
        if not flags or not all(isinstance(f, str) for f in flags):
            return
        dest = kw.get("dest")
        if isinstance(dest, cst.SimpleString):
            dest = dest.evaluated_value
        else:
            long = [f for f in flags if f.startswith("--")]
            dest = (long[0][2:] if long else flags[0].lstrip("-")).replace("-", "_")
        default = _literal(self.module, kw["default"]) if "default" in kw else None
        action = kw.get("action")
        self.options.setdefault(dest, []).append({
            "line": line, "flags": flags, "default": default,
            "action": "" if action is None else action.evaluated_value if isinstance(action, cst.SimpleString)
            else self.module.code_for_node(action)})


def _through_options(module: cst.Module, edits: list[Edit],
                     passed: Sequence[str] = ()) -> tuple[list[Edit], list[tuple[Edit, str]]]:
    """``edits`` with each ``loader`` keyword whose value is not a literal taken out: moved to the default of the
    script's own option where the value is one (``args.workers``), else returned as skipped with its reason."""
    finder = _Options(module)
    MetadataWrapper(module).visit(finder)
    out: list[Edit] = []
    skipped: list[tuple[Edit, str]] = []
    for e in edits:
        call = finder.loaders.get(e.line) if e.kind == "loader" else None
        if not call:
            out.append(e)
            continue
        params = dict(e.params)
        workers = call.get("num_workers")
        moved = False  # num_workers written as its option's default
        for key, value in e.params.items():
            node = call.get(key)
            if node is None or _is_literal(module, node):
                continue
            code = module.code_for_node(node).strip()
            params.pop(key)
            kind, what = _source_of(node, finder.options, passed)
            label = loader_label([key], e.technique)
            if kind == "option":
                out.append(Edit("argparse_default", e.file, what["line"],
                                {"value": value, "flags": what["flags"], "dest": code}, label))
                moved = moved or key == "num_workers"
            else:
                skipped.append((Edit("loader", e.file, e.line, {key: value}, label), f"{key} is set from {code} on "
                                f"line {e.line}" + (f", and your command passes {what} itself: run it with {what} "
                                                    f"{value}" if kind == "passed" else
                                                    what.format(value=repr(value)))))
        if "num_workers" in e.params and "num_workers" not in params and not moved:
            for key in [k for k in _NEEDS_WORKERS if k in params]:  # measured with those workers: not without them
                skipped.append((Edit("loader", e.file, e.line, {key: params.pop(key)},
                                     loader_label([key], e.technique)),
                                f"{key} goes with num_workers={e.params['num_workers']} on line {e.line}, which "
                                f"is not written (above): add it with the workers"))
        elif workers is not None and not _is_literal(module, workers) and "num_workers" not in params:
            # the workers come from an expression (written there or not): what needs workers follows its value,
            # valid whatever it is (torch refuses these two without workers)
            n = module.code_for_node(workers).strip()
            for key, form in _NEEDS_WORKERS.items():
                if key in params and not isinstance(params[key], Code):
                    params[key] = Code(form.format(n=n, v=repr(params[key])))
        if params:
            out.append(Edit(e.kind, e.file, e.line, params,
                            e.technique if params == e.params else loader_label(list(params), e.technique)))
    return out, skipped


def loader_elsewhere(source: str, edit: Edit, *, script: str = "", script_source: str = "",
                     passed: Sequence[str] = ()) -> tuple[list[Edit], list[str]]:
    """A ``loader`` edit whose ``DataLoader(...)`` call is in a file other than the script: what can still be
    written into the script, and what to type for the rest.

    A keyword whose value in that call is an option of the script (``num_workers=args.workers``, ``--workers``
    declared in ``script_source``, with a literal default and no ``action``), and which the command does not pass,
    becomes an ``argparse_default`` edit of ``script``: the proof then measures it. For the others, one clause
    each: ``num_workers=2`` where the call has a literal or nothing; the argument to pass where the command passes
    the option itself; for any other expression, to give it the value where it comes from; for
    ``persistent_workers`` and ``prefetch_factor`` next to workers from an option, the form that follows it.

    Returns
    -------
    (list of Edit, list of str)
        The edits of ``script``, and the clauses; ``([], [])`` when ``source`` does not parse or has no
        ``DataLoader(...)`` call on the edit's line (the caller then names the keywords plainly).
    """
    try:
        module = cst.parse_module(source)
    except cst.ParserSyntaxError:
        return [], []
    here = _Options(module)
    MetadataWrapper(module).visit(here)
    call = here.loaders.get(edit.line)
    if call is None:
        return [], []
    try:
        main = cst.parse_module(script_source) if script_source else None
    except cst.ParserSyntaxError:
        main = None
    options: dict[str, list[dict[str, Any]]] = {}
    if main is not None:
        finder = _Options(main)
        MetadataWrapper(main).visit(finder)
        options = finder.options
    edits: list[Edit] = []
    out = []
    workers = call.get("num_workers")
    for key, value in edit.params.items():
        node = call.get(key)
        if key in _NEEDS_WORKERS and workers is not None and not _is_literal(module, workers) and (
                node is None or _is_literal(module, node)):
            n = module.code_for_node(workers).strip()
            out.append(f"{key}={_NEEDS_WORKERS[key].format(n=n, v=repr(value))}")
            continue
        if node is None or _is_literal(module, node):
            out.append(f"{key}={value!r}")
            continue
        code = module.code_for_node(node).strip()
        kind, what = _source_of(node, options, passed)
        if kind == "option":
            edits.append(Edit("argparse_default", script, what["line"],
                              {"value": value, "flags": what["flags"], "dest": code},
                              loader_label([key], edit.technique)))
        elif kind == "passed":
            out.append(f"{key} comes from your option {what}: run it with {what} {value}")
        else:
            out.append(f"{key} is set from {code}" + what.format(value=repr(value)))
    return edits, out


def _source_of(node: cst.BaseExpression, options: dict[str, list[dict[str, Any]]],
               passed: Sequence[str]) -> tuple[str, Any]:
    """Where a keyword's non-literal value comes from: ``("passed", flag)`` (an option of the script that the
    command sets itself), ``("option", option)`` (one whose default can be written) or ``("other", clause)``."""
    opt = _option_of(node, options)
    if not isinstance(opt, dict):
        return "other", opt
    given = _passed_flag(opt["flags"], passed)
    return ("passed", given) if given else ("option", opt)


def _passed_flag(flags: Sequence[str], passed: Sequence[str]) -> str | None:
    """The flag of ``flags`` that the arguments ``passed`` set (``--workers 0``, ``--workers=0``), or None."""
    return next((f for f in flags for a in passed if a == f or a.startswith(f + "=")), None)


def _literal(module: cst.Module, node: cst.BaseExpression) -> Any:
    """The value of ``node`` where it is a Python literal (``ast.literal_eval``), else :data:`_NOT_LITERAL`."""
    import ast

    try:
        return ast.literal_eval(module.code_for_node(node).strip())
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return _NOT_LITERAL


def _is_literal(module: cst.Module, node: cst.BaseExpression) -> bool:
    return _literal(module, node) is not _NOT_LITERAL


def _option_of(node: cst.BaseExpression, options: dict[str, list[dict[str, Any]]]) -> dict[str, Any] | str:
    """The argparse option a keyword's value reads (``args.workers``: the one ``add_argument`` with dest
    ``workers``, a literal default and no ``action``), or the clause that says why not."""
    keep = ": tune does not replace your expression; make it {value} where that value comes from"
    if not (isinstance(node, cst.Attribute) and isinstance(node.value, cst.Name)):
        return keep
    found = options.get(node.attr.value) or []
    if len(found) != 1:
        return keep if not found else f" (an option declared {len(found)} times){keep}"
    opt = found[0]
    if opt["action"] == "store_true":
        return f", the option {opt['flags'][0]}: pass {opt['flags'][0]} when you run the script"
    if opt["action"]:
        return f" (the option {opt['flags'][0]} has action={opt['action']!r}){keep}"
    if opt["default"] is _NOT_LITERAL:
        return f" (the option {opt['flags'][0]} has a computed default){keep}"
    return opt


_NOT_LITERAL = object()


class _FrameworkCalls(cst.CSTVisitor):
    METADATA_DEPENDENCIES = (PositionProvider, QualifiedNameProvider)

    def __init__(self, module: cst.Module) -> None:
        super().__init__()
        self.module = module
        self.found: list[dict[str, Any]] = []

    def visit_Call(self, node: cst.Call) -> None:
        for q in self.get_metadata(QualifiedNameProvider, node.func, set()):
            if q.name in FRAMEWORK_CALLS:
                framework, call = FRAMEWORK_CALLS[q.name]
                self.found.append({"framework": framework, "call": _name_of(node.func), "qualified": q.name,
                                   "line": self.get_metadata(PositionProvider, node).start.line,
                                   "keywords": sorted(a.keyword.value for a in node.args if a.keyword is not None),
                                   "literals": {a.keyword.value: v for a in node.args if a.keyword is not None
                                                for v in [_literal(self.module, a.value)] if v is not _NOT_LITERAL},
                                   "spread": any(a.star for a in node.args)})
                return


def framework_calls(source: str) -> list[dict[str, Any]]:
    """The calls in ``source`` of a framework class that owns the DataLoader or the precision
    (:data:`FRAMEWORK_CALLS`), found by the name they are imported as (``import lightning as L``,
    ``from transformers import TrainingArguments``...), in the order they appear.

    Returns
    -------
    list of dict
        ``framework`` ("lightning", "pytorch_lightning", "transformers", "accelerate"), ``call`` (the name as
        written last: ``Trainer``), ``qualified`` (``lightning.Trainer``), ``line`` (1-based), ``keywords`` (the
        keyword names passed), ``literals`` (the keywords whose value is a literal, with it:
        ``{"dataloader_num_workers": 1}``), ``spread`` (the call passes ``*args`` or ``**kwargs``: its settings may
        come from there). Empty for a source that does not parse.
    """
    try:
        module = cst.parse_module(source)
    except cst.ParserSyntaxError:
        return []
    finder = _FrameworkCalls(module)
    MetadataWrapper(module).visit(finder)
    return finder.found


def unified_diff(old: str, new: str, path: str, new_path: str | None = None) -> str:
    """The change as a unified diff (``a/path`` -> ``b/path``), or "" when nothing changed."""
    lines = difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True),
                                 fromfile=f"a/{path}", tofile=f"b/{new_path or path}")
    return "".join(lines)


def _merged_lines(carried: Sequence[cst.EmptyLine], own: Sequence[cst.EmptyLine]) -> list[cst.EmptyLine]:
    """The lines above a statement once the statement above it is removed: the removed one's comments, then the
    statement's own, with as many blank lines first as the larger of the two had (not their sum: removing a line
    between two blocks leaves the blocks' own spacing, as a person's edit would)."""
    def blanks(lines: Sequence[cst.EmptyLine]) -> int:
        n = 0
        for ln in lines:
            if ln.comment is not None:
                break
            n += 1
        return n

    a, b = blanks(carried), blanks(own)
    return [cst.EmptyLine()] * max(a, b) + [*carried[a:], *own[b:]]

