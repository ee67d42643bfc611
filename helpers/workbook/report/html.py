"""The run report as one self-contained HTML page: report.html (inline CSS, embedded figures, no JavaScript)."""

from __future__ import annotations

import base64
import html
from pathlib import Path

from helpers.workbook.report.collect import (Report, _advice, _artifacts, _job_line, _rec_text, _status_line, _why,
                                             change_in_code, collect, overall_verdict)
from helpers.workbook.report.format import (GLOSSARY, _context, _fmt, _records_caption, _records_table, headline,
                                             verdict_lines)

#: Sections whose records table is shown unfolded when it has at most this many rows.
OPEN_RECORD_ROWS = 8

_CSS = """
*{box-sizing:border-box}
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;max-width:1180px;margin:1.5em auto;
 padding:0 1.2em;color:#1f2328;line-height:1.45;background:#fff}
h1{font-size:1.6em;margin:.2em 0}h2{font-size:1.25em;margin-top:2em;padding-top:.6em;border-top:1px solid #e5e7eb}
a{color:#0b5cad}code{background:#f3f4f6;padding:1px 4px;border-radius:3px;font-size:.92em}
.meta{color:#57606a;font-size:.92em}
.verdict{font-size:1.35em;font-weight:650;background:#f0f6ff;border-left:6px solid #0b5cad;padding:.6em .9em;
 margin:.8em 0}
.advice{margin:.4em 0 1em 0;padding-left:1.2em}.advice li{margin:.15em 0}
.note{background:#fff8e1;border-left:4px solid #d49b00;padding:.4em .8em;margin:.5em 0}
table{border-collapse:collapse;margin:.8em 0;font-size:.92em;width:100%}
th,td{border-bottom:1px solid #e5e7eb;padding:6px 8px;text-align:left;vertical-align:top}
th{background:#f6f8fa;font-weight:600;border-bottom:2px solid #d0d7de}
tr:nth-child(even) td{background:#fbfbfc}
#checklist td.effect{white-space:nowrap;font-variant-numeric:tabular-nums}
#checklist td.why{color:#343a40;font-size:.95em}
.badge{display:inline-block;padding:1px 9px;border-radius:999px;font-size:.85em;font-weight:650;white-space:nowrap;
 border:1px solid transparent}
.b-enable{background:#dcfce7;color:#166534;border-color:#86efac}
.b-leave-off{background:#f1f5f9;color:#475569;border-color:#cbd5e1}
.b-not-applicable{background:#fff;color:#6b7280;border-color:#d1d5db}
.b-host-bound{background:#ffedd5;color:#9a3412;border-color:#fdba74}
.b-device-bound{background:#dbeafe;color:#1e40af;border-color:#93c5fd}
.b-balanced{background:#ede9fe;color:#5b21b6;border-color:#c4b5fd}
.b-missing,.b-not-run,.b-did-not-finish,.b-interrupted{background:#fef9c3;color:#854d0e;border-color:#fde047}
.b-failed{background:#fee2e2;color:#991b1b;border-color:#fca5a5}
.b-inconclusive{background:#fef3c7;color:#92400e;border-color:#f59e0b}
.b-no-recommendation{background:#f3f4f6;color:#374151}
.figs{display:flex;flex-wrap:wrap;gap:0 1.2em;align-items:flex-start}
figure{margin:.8em 0;max-width:100%}img{max-width:100%;height:auto;border:1px solid #e5e7eb;border-radius:4px}
figcaption{color:#57606a;font-size:.88em}
details{margin:.6em 0}summary{cursor:pointer;color:#0b5cad}
.advice li.failed{color:#991b1b}
pre.error{background:#fef2f2;border:1px solid #fecaca;padding:.5em .8em;border-radius:4px;overflow-x:auto;
 font-size:.85em;white-space:pre-wrap;word-break:break-word}
.missing{background:#fffbeb;border:1px solid #fde68a;padding:.5em .8em;border-radius:4px}
"""


def _badge(text: str) -> str:
    cls = "b-" + "".join(c if c.isalnum() else "-" for c in text.lower())
    return f"<span class='badge {cls}'>{html.escape(text)}</span>"


def _code_spans(text: str) -> str:
    """Escape ``text`` and turn `backquoted` parts into <code> (commands in missing-result messages)."""
    parts = text.split("`")
    return "".join(f"<code>{html.escape(p)}</code>" if i % 2 else html.escape(p) for i, p in enumerate(parts))


def to_html(run_dir: Path | Report) -> str:
    """Render the report as one self-contained HTML page.

    Figures are embedded as base64 PNG data URIs and the CSS is inline, so
    the file can be mailed or opened offline; it makes no network request and
    uses no JavaScript. Links to executed notebooks and artifacts are
    relative to the run folder.

    Parameters
    ----------
    run_dir : Path or Report
        A run folder, or a :class:`Report` already collected from one.
    """
    rep = run_dir if isinstance(run_dir, Report) else collect(Path(run_dir))
    e = html.escape
    name, profile, device, status, dur = _status_line(rep)
    parts = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        f"<title>Workbook report {e(name)}</title><style>{_CSS}</style></head><body>",
        "<h1>Training-performance workbook: run report</h1>",
        f"<p class='verdict' id='verdict'>{e(overall_verdict(rep))}</p>",
        (f"<p class='meta'>Run <code>{e(name)}</code> · profile <b>{e(profile)}</b> · device <b>{e(device)}</b> · "
         f"status {_badge(status) if status in ('failed', 'interrupted') else '<b>' + e(status) + '</b>'} · "
         f"{e(dur)} s</p>") if rep.state else
        f"<p class='meta'>Folder <code>{e(name)}</code>: records only (no run.json, e.g. notebooks run by hand)</p>",
        f"<p class='meta'>Job measured: {e(_job_line(rep))}</p>",
    ]
    advice = _advice(rep)
    if advice:
        parts.append("<ul class='advice'>" + "".join(
            f"<li{' class=failed' if label == 'Failed' else ''}><b>{e(label)}:</b> {e(items)}</li>"
            for label, items in advice) + "</ul>")
    for note in rep.notes:
        parts.append(f"<p class='note'>{e(note)}</p>")
    parts.append("<table id='checklist'><thead><tr><th>item</th><th>measured effect</th><th>recommendation</th>"
                 "<th>why</th><th>notebook</th></tr></thead><tbody>")
    for s in rep.sections:
        nb_link = (f"<a href='{e(s.executed.as_posix())}'>{e(s.executed.name)}</a>" if s.executed
                   else "<span class='meta'>—</span>")
        if s.executed_html:
            nb_link += f" · <a href='{e(s.executed_html.as_posix())}'>html</a>"
        parts.append(
            f"<tr data-notebook='{e(s.id)}'><td><a href='#{e(s.id)}'>{e(s.item)}</a></td>"
            f"<td class='effect'>{e(headline(s.verdict))}</td><td>{_badge(_rec_text(s))}</td>"
            f"<td class='why'>{_code_spans(_why(s))}</td><td>{nb_link}</td></tr>")
    parts.append("</tbody></table>")
    parts.append("<p class='meta'>How to read it: " + "; ".join(f"<i>{e(k)}</i>: {e(d)}" for k, d in GLOSSARY)
                 + ".</p>")
    for s in rep.sections:
        title = f"{s.number} {s.item}".strip()
        parts.append(f"<section><h2 id='{e(s.id)}'>{e(title)} {_badge(_rec_text(s))}</h2>")
        if s.verdict:
            head, clauses = verdict_lines(s.verdict)
            parts.append(f"<p class='verdict-headline'><b>{e(head)}</b></p>"
                         "<ul class='verdict-details'>" + "".join(f"<li>{e(c)}</li>" for c in clauses) + "</ul>"
                         f"<p class='meta'>Measured: {e(str(s.verdict.get('metric')))} = {e(headline(s.verdict))}"
                         + (f" · ran {e(_fmt(s.duration_s))} s" if s.duration_s is not None else "") + "</p>")
            if _context(s.verdict):
                parts.append(f"<p class='meta'><i>Setting:</i> {e(_context(s.verdict))}</p>")
        else:
            parts.append(f"<p class='missing'>{_code_spans(s.missing or '')}</p>")
            if s.error_tail:
                parts.append(f"<details><summary>Last lines of the error</summary>"
                             f"<pre class='error'>{e(s.error_tail)}</pre></details>")
        links = []
        if s.executed:
            links.append(f"executed notebook <a href='{e(s.executed.as_posix())}'>{e(s.executed.as_posix())}</a>"
                         + (f" (<a href='{e(s.executed_html.as_posix())}'>as a web page</a>)" if s.executed_html
                            else ""))
        for art in _artifacts(rep.run_dir, s.id):
            rel = art.relative_to(rep.run_dir).as_posix()
            links.append(f"artifact <a href='{e(rel)}'>{e(rel)}</a>")
        if links:
            parts.append("<p class='meta'>" + " · ".join(links) + "</p>")
        if s.figures:
            parts.append("<div class='figs'>")
        for fig, data in s.figures:
            b64 = base64.b64encode(data).decode("ascii")
            caption = fig.stem.split("__", 1)[-1].replace("_", " ")
            parts.append(f"<figure><img alt='{e(caption)}' src='data:image/png;base64,{b64}'>"
                         f"<figcaption>{e(caption)}</figcaption></figure>")
        if s.figures:
            parts.append("</div>")
        for fig, why in s.bad_figures:
            parts.append(f"<p class='note'>Figure {e(fig.name)} could not be shown: {e(why)}</p>")
        if s.verdict and not s.figures and not s.bad_figures:
            parts.append(f"<p class='meta'>No figure was saved (figures/{e(s.id)}__*.png).</p>")
        table, notes = _records_table(s.records)
        if len(table):
            opened = " open" if len(table) <= OPEN_RECORD_ROWS else ""
            parts.append(f"<details{opened}><summary>{e(_records_caption(len(s.records), notes))}</summary>"
                         + table.to_html(index=False, border=0, classes="records", escape=True) + "</details>")
        parts.append("</section>")
    head, diff, notes = change_in_code(rep)
    if head:
        parts.append(f"<section id='change'><h2>The change in your code</h2><p>{e(head)}</p>")
        if diff:
            parts.append(f"<pre>{e(diff.rstrip())}</pre>")
        if notes:
            parts.append("<ul>" + "".join(f"<li>{_code_spans(n)}</li>" for n in notes) + "</ul>")
        parts.append("</section>")
    parts.append("</body></html>")
    return "\n".join(parts)
