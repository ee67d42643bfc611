"""The run report as Markdown: report.md.

Every string that is not the workbook's own markup (a job's name or path, a
folder, a parameter value, a verdict's reason, an error message) goes through
:func:`md_escape` (or :func:`md_code` for a code span), so that it renders as
the text it is: a job named ``<script>…</script>`` or ``a|b`` shows as such
and neither runs as HTML nor splits a table row.
"""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from helpers.workbook.report.collect import (Report, _advice, _artifacts, _job_line, _rec_text, _status_line, _why,
                                             change_in_code, collect, overall_verdict)
from helpers.workbook.report.format import (GLOSSARY, _context, _records_caption, _records_table, headline,
                                             verdict_lines)


#: Markdown's inline markup characters, escaped with a backslash by :func:`md_escape`; a ``]`` only where a link or
#: an image could close (``](`` or ``][``), so that ``dataset[37]`` stays as it reads.
_MD_MARKUP = re.compile(r"([\\`*|~]|\](?=[(\[]))")
#: An underscore that can open or close emphasis: not between two letters or digits (``batch_size`` stays as is,
#: ``__init__`` is escaped).
_MD_UNDERSCORE = re.compile(r"(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])")


def md_escape(text) -> str:
    """Escape a user-provided string so that Markdown renders it as plain text on one line.

    HTML's special characters become entities (``&`` ``&amp;``, ``<`` ``&lt;``,
    ``>`` ``&gt;``: no tag of a job's name runs in a viewer); Markdown's
    markup characters (backslash, backtick, ``*``, ``|``, ``~``, a ``]`` that
    could close a link, an underscore that could start emphasis) get a
    backslash, so a ``|`` does not split a table row, a backtick opens no code
    span, ``[text](url)`` makes no link; ``dataset[37]`` or ``batch_size``
    stay as they read. Line breaks become spaces, so the string cannot start
    a heading or a list.

    Parameters
    ----------
    text : object
        The string (anything else is converted with ``str``).

    Returns
    -------
    str
        The escaped text, for any place of report.md outside a code span.
    """
    s = str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    s = _MD_UNDERSCORE.sub(r"\\_", _MD_MARKUP.sub(r"\\\1", s))
    return " ".join(s.splitlines())


def md_code(text, *, in_table: bool = False) -> str:
    """A Markdown code span that shows ``text`` as it is (its own backticks, ``<`` and ``&`` included).

    The fence is one backtick longer than the longest run of backticks in the text; in a table cell a ``|`` is
    written ``\\|`` (GitHub's tables split on it even inside code spans).
    """
    s = " ".join(str(text).splitlines())
    if in_table:
        s = s.replace("|", "\\|")
    fence = "`" * (max((len(r) for r in re.findall(r"`+", s)), default=0) + 1)
    pad = " " if s.startswith("`") or s.endswith("`") else ""
    return f"{fence}{pad}{s}{pad}{fence}"


#: A backquoted command of the workbook's messages: the opening backtick starts the text or follows a space or "(",
#: the closing one ends it or comes before a space or punctuation; a backtick inside a user's quoted path (``x`y``)
#: is part of the command.
_CODE_SPAN = re.compile(r"(?:^|(?<=[\s(]))`(.+?)`(?=$|[\s.,;:)])", re.S)


def md_code_spans(text, *, in_table: bool = False) -> str:
    """:func:`md_escape` for a sentence whose backquoted parts are commands (the workbook's missing-result
    messages, advice, reasons): those become code spans (as report.html shows them in ``<code>``), safe for any
    text; the rest is escaped."""
    text, out, pos = str(text), [], 0
    for m in _CODE_SPAN.finditer(text):
        out += [md_escape(text[pos:m.start()]), md_code(m.group(1), in_table=in_table)]
        pos = m.end()
    return "".join(out + [md_escape(text[pos:])])


def _fence(text: str) -> str:
    """A ``~`` fence longer than any run of ``~`` at the start of a line of ``text`` (an error tail)."""
    return "~" * max([4] + [len(m) + 1 for m in re.findall(r"^\s*(~{3,})", text, flags=re.M)])


def _md_cell(text) -> str:
    return md_escape(text)


def _md_table(df: pd.DataFrame) -> str:
    cols = [str(c) for c in df.columns]
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for row in df.itertuples(index=False):
        out.append("| " + " | ".join(_md_cell(x) for x in row) + " |")
    return "\n".join(out)


def to_markdown(run_dir: Path | Report) -> str:
    """Render the report as Markdown (figures linked by their path relative to the run folder).

    Parameters
    ----------
    run_dir : Path or Report
        A run folder, or a :class:`Report` already collected from one.
    """
    rep = run_dir if isinstance(run_dir, Report) else collect(Path(run_dir))
    name, profile, device, status, dur = _status_line(rep)
    e = md_escape
    lines = ["# Training-performance workbook: run report", "",
             f"**Verdict: {e(overall_verdict(rep))}**", "",
             (f"Run {md_code(name)} · profile **{e(profile)}** · device **{e(device)}** · status **{e(status)}** · "
              f"{e(dur)} s" if rep.state else
              f"Folder {md_code(name)}: records only (no run.json, e.g. notebooks run by hand)"),
             "", f"Job measured: {e(_job_line(rep))}"]
    for label, items in _advice(rep):
        lines += ["", f"- {e(label)}: {md_code_spans(items)}"]
    for note in rep.notes:
        lines += ["", f"> Note: {md_code_spans(note)}"]
    lines += ["", "## Checklist", "", "| item | measured effect | recommendation | why | notebook |",
              "|---|---|---|---|---|"]
    for s in rep.sections:
        link = f"[{s.executed.as_posix()}]({s.executed.as_posix()})" if s.executed else "—"
        if s.executed_html:
            link += f" · [html]({s.executed_html.as_posix()})"
        lines.append(f"| [{_md_cell(s.item)}](#{s.id}) | {_md_cell(headline(s.verdict))} | "
                     f"**{_md_cell(_rec_text(s))}** | {md_code_spans(_why(s), in_table=True)} | {link} |")
    lines += ["", "How to read it: " + "; ".join(f"*{k}*: {d}" for k, d in GLOSSARY) + "."]
    for s in rep.sections:
        lines += ["", f'<a id="{s.id}"></a>', "", f"## {s.number} {e(s.item)}".strip() + f" ({md_code(s.id)})", ""]
        if s.verdict:
            head, clauses = verdict_lines(s.verdict)
            lines += [f"**{e(head)}**", ""] + [f"- {md_code_spans(c)}" for c in clauses] + [""]
            lines.append(f"Measured: {e(s.verdict.get('metric'))} = {e(headline(s.verdict))}")
            if _context(s.verdict):
                lines += ["", f"*Setting:* {e(_context(s.verdict))}"]
        else:
            lines.append(f"**{e(_rec_text(s))}**: {md_code_spans(s.missing)}")
            if s.error_tail:  # a fenced block shows the text as it is
                fence = _fence(s.error_tail)
                lines += ["", "Last lines of the error:", "", f"{fence}text", s.error_tail, fence]
        if s.executed:
            lines += ["", f"Executed notebook: [{s.executed.as_posix()}]({s.executed.as_posix()})"
                      + (f" ([as a web page]({s.executed_html.as_posix()}))" if s.executed_html else "")]
        for art in _artifacts(rep.run_dir, s.id):
            rel = art.relative_to(rep.run_dir).as_posix()
            lines += ["", f"Artifact: [{e(rel)}]({rel})"]
        for fig, _ in s.figures:
            lines += ["", f"![{e(fig.stem.split('__', 1)[-1])}]({fig.relative_to(rep.run_dir).as_posix()})"]
        for fig, why in s.bad_figures:
            lines += ["", f"> Figure {e(fig.name)} could not be shown: {e(why)}"]
        if s.verdict and not s.figures and not s.bad_figures:
            lines += ["", f"*No figure was saved (figures/{s.id}__*.png).*"]
        table, notes = _records_table(s.records)
        if len(table):
            lines += ["", _records_caption(len(s.records), notes) + ":", "", _md_table(table)]
    head, diff, notes = change_in_code(rep)
    if head:
        lines += ["", "## The change in your code", "", e(head)]
        if diff:
            fence = _fence(diff)
            lines += ["", f"{fence}diff", diff.rstrip("\n"), fence]
        lines += [""] + [f"- {md_code_spans(n)}" for n in notes]
    return "\n".join(lines) + "\n"
