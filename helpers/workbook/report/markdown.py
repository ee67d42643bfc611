"""The run report as Markdown: report.md."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from helpers.workbook.report.collect import (Report, _advice, _artifacts, _job_line, _rec_text, _status_line, _why, collect,
                                             overall_verdict)
from helpers.workbook.report.format import GLOSSARY, _context, _records_caption, _records_table, headline


def _md_cell(text) -> str:
    return str(text).replace("|", "/").replace("\n", " ")


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
    lines = ["# Training-performance workbook: run report", "",
             f"**Verdict: {overall_verdict(rep)}**", "",
             (f"Run `{name}` · profile **{profile}** · device **{device}** · status **{status}** · {dur} s"
              if rep.state else f"Folder `{name}`: records only (no run.json, e.g. notebooks run by hand)"),
             "", f"Job measured: {_job_line(rep)}"]
    for label, items in _advice(rep):
        lines += ["", f"- {label}: {items}"]
    for note in rep.notes:
        lines += ["", f"> Note: {note}"]
    lines += ["", "## Checklist", "", "| item | measured effect | recommendation | why | notebook |",
              "|---|---|---|---|---|"]
    for s in rep.sections:
        link = f"[{s.executed.as_posix()}]({s.executed.as_posix()})" if s.executed else "—"
        if s.executed_html:
            link += f" · [html]({s.executed_html.as_posix()})"
        lines.append(f"| [{_md_cell(s.item)}](#{s.id}) | {_md_cell(headline(s.verdict))} | "
                     f"**{_md_cell(_rec_text(s))}** | {_md_cell(_why(s))} | {link} |")
    lines += ["", "How to read it: " + "; ".join(f"*{k}*: {d}" for k, d in GLOSSARY) + "."]
    for s in rep.sections:
        lines += ["", f'<a id="{s.id}"></a>', "", f"## {s.number} {s.item}".strip() + f" (`{s.id}`)", ""]
        if s.verdict:
            lines.append(f"**{s.verdict.get('recommendation')}**: {s.verdict.get('reason')}  ")
            lines.append(f"Measured: {s.verdict.get('metric')} = {headline(s.verdict)}")
            if _context(s.verdict):
                lines += ["", f"*Setting:* {_context(s.verdict)}"]
        else:
            lines.append(f"**{_rec_text(s)}**: {s.missing}")
            if s.error_tail:
                lines += ["", "Last lines of the error:", "", "~~~~text", s.error_tail, "~~~~"]
        if s.executed:
            lines += ["", f"Executed notebook: [{s.executed.as_posix()}]({s.executed.as_posix()})"
                      + (f" ([as a web page]({s.executed_html.as_posix()}))" if s.executed_html else "")]
        for art in _artifacts(rep.run_dir, s.id):
            rel = art.relative_to(rep.run_dir).as_posix()
            lines += ["", f"Artifact: [{rel}]({rel})"]
        for fig, _ in s.figures:
            lines += ["", f"![{fig.stem.split('__', 1)[-1]}]({fig.relative_to(rep.run_dir).as_posix()})"]
        for fig, why in s.bad_figures:
            lines += ["", f"> Figure {fig.name} could not be shown: {why}"]
        if s.verdict and not s.figures and not s.bad_figures:
            lines += ["", f"*No figure was saved (figures/{s.id}__*.png).*"]
        table, notes = _records_table(s.records)
        if len(table):
            lines += ["", _records_caption(len(s.records), notes) + ":", "", _md_table(table)]
    return "\n".join(lines) + "\n"
