"""The source edit of tune's CPU threads candidate (:mod:`helpers.tune.candidates_cpu`), a pass of its own, made
after :func:`helpers.tune.rewrite.apply_edits`' others (it places no code at a captured line, so their lines stand):

- ``set_threads``: ``torch.set_num_threads(N)  # <what N stands on>`` after the file's last top-level import (a
  script may set ``os.environ`` between its imports), a blank line before it: it runs when the script starts,
  before any of its ops, as ``OMP_NUM_THREADS=N`` in the launch would. ``torch`` as the file names it
  (``import torch as th``: ``th.set_num_threads``); where the file has no top-level ``import torch``, the edit is
  skipped with that reason.
"""

from __future__ import annotations

from typing import Sequence

import libcst as cst

from helpers.errors import ParameterError
from helpers.tune.rewrite_common import Edit

#: The edits this pass makes.
CPU_KINDS = ("set_threads",)


def _torch_name(module: cst.Module) -> str | None:
    """The name a top-level ``import torch`` (or ``import torch as X``) binds, or None."""
    for stmt in module.body:
        if isinstance(stmt, cst.SimpleStatementLine):
            for small in stmt.body:
                if isinstance(small, cst.Import):
                    for a in small.names:
                        if isinstance(a.name, cst.Name) and a.name.value == "torch":
                            return a.asname.name.value if a.asname is not None else "torch"
    return None


def _after_last_import(body: Sequence[cst.BaseStatement]) -> int:
    """The index after the module's last top-level import statement."""
    at = 0
    for i, stmt in enumerate(body):
        if isinstance(stmt, cst.SimpleStatementLine) and any(isinstance(x, (cst.Import, cst.ImportFrom))
                                                             for x in stmt.body):
            at = i + 1
    return at


def threads_pass(source: str, edits: Sequence[Edit]) -> tuple[str, list[Edit], list[tuple[Edit, str]]]:
    """Make the ``set_threads`` edits of ``edits`` (the last one's ``params["threads"]`` and ``params["note"]``: one
    call is written).

    Returns
    -------
    (str, list of Edit, list of (Edit, str))
        The new text, the edits made, and each edit not made with its reason.

    Raises
    ------
    ParameterError
        On a source that does not parse (libcst's message).
    """
    if not edits:
        return source, [], []
    try:
        module = cst.parse_module(source)
    except cst.ParserSyntaxError as exc:
        raise ParameterError(f"rewrite: the file does not parse: {exc}") from None
    e = edits[-1]
    n = int(e.params["threads"])
    name = _torch_name(module)
    if name is None:
        why = (f"the file has no top-level import torch: put torch.set_num_threads({n}) after its import by hand, "
               f"before the first op")
        return source, [], [(x, why) for x in edits]
    note = f"  # {e.params['note']}" if e.params.get("note") else ""
    stmt = cst.parse_statement(f"{name}.set_num_threads({n}){note}\n")
    body = list(module.body)
    at = _after_last_import(body)
    stmt = stmt.with_changes(leading_lines=[cst.EmptyLine()] if at else [])
    if at < len(body) and not body[at].leading_lines:  # the code after it keeps a blank line between them
        body[at] = body[at].with_changes(leading_lines=[cst.EmptyLine()])
    return module.with_changes(body=[*body[:at], stmt, *body[at:]]).code, list(edits), []
