"""What tune's source rewriters share (:mod:`helpers.tune.rewrite`, :mod:`helpers.tune.rewrite_ddp`): the
:class:`Edit` a candidate asks for, a keyword set in a call, and where a module's imports are and end."""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any, Sequence

import libcst as cst

from helpers.errors import ParameterError


#: The edits of DistributedDataParallel and its collectives, made first, in a pass of their own
#: (:func:`helpers.tune.rewrite_ddp._ddp_pass`).
DDP_KINDS = ("no_sync", "ddp_keywords", "comm_hook")
#: What the ``comm_hook`` edit imports (torch's module of DDP's own communication hooks).
COMM_HOOKS_IMPORT = "from torch.distributed.algorithms.ddp_comm_hooks import default_hooks"
#: The qualified names a script reaches ``DistributedDataParallel`` by (torch.nn.parallel's exports).
DDP_NAMES = {"torch.nn.parallel.DistributedDataParallel", "torch.nn.parallel.distributed.DistributedDataParallel"}


@dataclass(frozen=True)
class Edit:
    """One source edit.

    Attributes
    ----------
    kind : str
        One of :data:`KINDS`.
    file : str
        Absolute path of the file to edit.
    line : int
        1-based line of the call site (for ``channels_last``: the optimizer's construction).
    params : dict
        ``loader``: the keyword arguments to set; ``autocast``: ``device_type`` and ``dtype`` (a torch dtype
        name); ``channels_last``: ``name`` (the model's variable) and ``assign`` (bool: ``name = name.to(...)``
        rather than ``name.to(...)``, which would make a global a local inside a function); ``call_keywords``:
        ``call`` (the called name as written last, e.g. ``TrainingArguments``) and ``values`` (the keywords);
        ``prefetch``: ``device`` (an expression for the model's device at the loop, or None where none was found);
        ``grad_scaler``: ``device_type``, ``backward`` (lines of the loss's ``backward()``), ``clip`` (lines of
        gradient clipping; may be empty); its ``line`` is the ``optimizer.step()`` statement's.
    technique : str
        The candidate's technique (for the report's hunk labels).
    """

    kind: str
    file: str
    line: int
    params: dict[str, Any] = field(default_factory=dict, hash=False)
    technique: str = ""


class Code(str):
    """A value written as this Python expression, not as a literal (``args.workers > 0``)."""


#: The shortest line limit a rewritten call is kept within: PEP 8's 79 characters ("Limit all lines to a maximum of
#: 79 characters", https://peps.python.org/pep-0008/#maximum-line-length); a file with longer lines of its own sets
#: its own limit (its longest line).
PEP8_LINE = 79


def line_limit(source: str) -> int:
    """The line length a rewrite keeps to in ``source``: its own longest line, at least :data:`PEP8_LINE`."""
    return max([PEP8_LINE] + [len(ln) for ln in source.splitlines()])


def _fit_call(call: cst.Call, line: str, before: str, limit: int) -> cst.BaseExpression:
    """``call`` written over several lines where, on one line, its line would run past ``limit`` characters.

    Parameters
    ----------
    call : libcst.Call
        The edited call (keywords added), written on one line.
    line : str
        The user's line the call stood on, unedited.
    before : str
        The call's text in ``line`` before the edit (the line's length changes by ``len(new) - len(before)``).
    limit : int
        Characters (:func:`line_limit`).

    Returns
    -------
    libcst.BaseExpression
        ``call`` unchanged where it fits, or spans lines already; else its arguments on one line of their own,
        indented one level past the statement (as black writes a call that does not fit), or, where that line
        too is long, one argument per line with a trailing comma.
    """
    code = cst.Module([]).code_for_node(call)
    if "\n" in code or "\n" in before or len(line) - len(before) + len(code) <= limit or not call.args:
        return call
    bare = [cst.Module([]).code_for_node(a.with_changes(comma=cst.MaybeSentinel.DEFAULT,
                                                         whitespace_after_arg=cst.SimpleWhitespace("")))
            for a in call.args]
    func = cst.Module([]).code_for_node(call.func)
    indent = len(line) - len(line.lstrip())
    one = "    " + ", ".join(bare)
    if indent + len(one) <= limit:
        text = f"{func}(\n{one}\n)"
    else:
        text = f"{func}(\n" + "".join(f"    {a},\n" for a in bare) + ")"
    return cst.parse_expression(text)


def _value(v: Any) -> cst.BaseExpression:
    if isinstance(v, Code):
        return cst.parse_expression(str(v))
    if isinstance(v, bool) or v is None or isinstance(v, (int, float)):
        return cst.parse_expression(repr(v))
    if isinstance(v, str):  # in double quotes, as formatters write them, where the text allows
        return cst.SimpleString(f'"{v}"' if '"' not in v and "\\" not in v and "\n" not in v else repr(v))
    raise ParameterError(f"rewrite: cannot write the value {v!r} as Python source")


def _no_comment(ws):
    """``ws`` without the comments and blank lines it holds (a line break and indentation stay)."""
    if isinstance(ws, cst.ParenthesizedWhitespace):
        return ws.with_changes(first_line=cst.TrailingWhitespace(), empty_lines=[])
    return ws


def _set_keywords(call: cst.Call, values: dict[str, Any], positional: Sequence[str] = ()) -> cst.Call:
    """``call`` with each keyword of ``values`` replaced or appended, formatted like the call's own arguments.

    A new argument goes after the last one, separated as the arguments before it are (on its own line in a call
    written one argument per line); a comment beside an existing argument stays with that argument and is never
    copied to a new one. ``positional`` names the callee's leading parameters in order (``("set_to_none",)`` for
    ``zero_grad``): a value of ``values`` passed positionally, ``zero_grad(False)``, is replaced where it is, and
    written as a keyword where no positional argument follows it (``zero_grad(set_to_none=True)``), never added a
    second time.
    """
    args = list(call.args)
    todo = dict(values)
    for i, a in enumerate(args):
        if a.keyword is not None and a.keyword.value in todo:
            args[i] = a.with_changes(value=_value(todo.pop(a.keyword.value)))
        elif a.keyword is None and not a.star and i < len(positional) and positional[i] in todo:
            value = _value(todo.pop(positional[i]))
            later = any(b.keyword is None and not b.star for b in args[i + 1:])
            args[i] = a.with_changes(value=value) if later else a.with_changes(
                value=value, keyword=cst.Name(positional[i]),
                equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""),
                                      whitespace_after=cst.SimpleWhitespace("")))
    for key, value in todo.items():
        new = cst.Arg(keyword=cst.Name(key), value=_value(value),
                      equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""),
                                            whitespace_after=cst.SimpleWhitespace("")))
        if not args:
            args.append(new)
            continue
        last = args[-1]
        # how arguments are separated: as between the last two, else as the call opens (a call of one argument
        # on its own line: its indentation), else one space
        sep = args[-2].comma.whitespace_after if len(args) >= 2 and isinstance(args[-2].comma, cst.Comma) else \
            call.whitespace_before_args if isinstance(call.whitespace_before_args, cst.ParenthesizedWhitespace) \
            else cst.SimpleWhitespace(" ")
        if isinstance(last.comma, cst.Comma):  # a trailing comma: the new argument ends the same way
            tail = last.comma
            own = tail.whitespace_after
            if isinstance(own, cst.ParenthesizedWhitespace) and isinstance(sep, cst.ParenthesizedWhitespace):
                # the last argument keeps its own end-of-line comment, indented as the arguments are
                last_ws = sep.with_changes(first_line=own.first_line, empty_lines=[])
            else:
                last_ws = _no_comment(sep)
            args[-1] = last.with_changes(comma=tail.with_changes(whitespace_after=last_ws))
            new = new.with_changes(comma=tail.with_changes(whitespace_after=_no_comment(own)))
        else:  # what followed the last argument (a line break before the closing parenthesis) follows the new one
            new = new.with_changes(whitespace_after_arg=last.whitespace_after_arg)
            args[-1] = last.with_changes(comma=cst.Comma(whitespace_after=_no_comment(sep)),
                                         whitespace_after_arg=cst.SimpleWhitespace(""))
        args.append(new)
    return call.with_changes(args=args)


def _names_used(module: cst.Module) -> set[str]:
    """Every name the file binds or reads, at any depth (parameters, locals, globals; not attributes or keyword
    arguments), with ``"*"`` where it has a star import (which may bind any name)."""
    found: set[str] = set()

    class Names(cst.CSTVisitor):
        def visit_Attribute(self, node: cst.Attribute) -> bool:
            node.value.visit(self)  # "args.prefetch": only the object's name counts
            return False

        def visit_Arg(self, node: cst.Arg) -> bool:
            node.value.visit(self)  # "f(prefetch=True)": the keyword binds nothing in the file
            return False

        def visit_Name(self, node: cst.Name) -> None:
            found.add(node.value)

        def visit_ImportStar(self, node: cst.ImportStar) -> None:
            found.add("*")

    module.visit(Names())
    return found


def _imports(module: cst.Module, name: str) -> bool:
    """Whether the module's top level has ``import <name>`` (no alias)."""
    for stmt in module.body:
        if isinstance(stmt, cst.SimpleStatementLine):
            for small in stmt.body:
                if isinstance(small, cst.Import) and any(
                        isinstance(a.name, cst.Name) and a.name.value == name and a.asname is None
                        for a in small.names):
                    return True
    return False


def _import_root(stmt: cst.BaseStatement) -> str:
    """The top-level module a one-import statement imports (``os`` for ``import os.path``), "" for anything else
    (a relative import, code)."""
    if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
        return ""
    small = stmt.body[0]
    if isinstance(small, cst.Import):
        return _module_root(small.names[0].name)
    if isinstance(small, cst.ImportFrom) and not small.relative and small.module is not None:
        return _module_root(small.module)
    return ""


def _module_root(node: cst.BaseExpression) -> str:
    while isinstance(node, cst.Attribute):
        node = node.value
    return node.value if isinstance(node, cst.Name) else ""


def _after_imports(body: Sequence[cst.BaseStatement]) -> int:
    """The index after the module's last top-level import (or its docstring), before other code."""
    at = 0
    for i, stmt in enumerate(body):
        if isinstance(stmt, cst.SimpleStatementLine) and all(
                isinstance(s, (cst.Import, cst.ImportFrom)) or (i == 0 and isinstance(s, cst.Expr))
                for s in stmt.body):
            at = i + 1
        elif i > 0:
            break
    return at


def _follow_lines(old: str, new: str, edits: Sequence[Edit]) -> list[Edit]:
    """``edits`` of ``old``'s lines, moved to where those lines are in ``new`` (a pass of its own made ``new`` by
    inserting or wrapping lines): each edit's line, and the lines its params name (``backward``, ``clip``,
    ``forward`` lists; ``step``). A line put before an old one (a ``with``'s header, an inserted statement, an
    ``if``) moves that old line down."""
    old_lines, new_lines = old.splitlines(), new.splitlines()
    moved: dict[int, int] = {}
    for _, a0, a1, b0, b1 in difflib.SequenceMatcher(None, old_lines, new_lines, autojunk=False).get_opcodes():
        grown = max(0, (b1 - b0) - (a1 - a0))  # lines put before the old ones
        for n in range(a0, a1):
            moved[n + 1] = min(b0 + grown + (n - a0), max(b0, b1 - 1)) + 1

    def lines(e: Edit) -> Edit:
        params = {k: [moved.get(n, n) for n in v] if k in ("backward", "clip", "forward") and isinstance(v, list)
                  else moved.get(v, v) if k == "step" and isinstance(v, int) else v for k, v in e.params.items()}
        return Edit(e.kind, e.file, moved.get(e.line, e.line), params, e.technique)

    return [lines(e) for e in edits]
