"""The report of ``python -m helpers trace``: notebook 01's verdict from profiler traces, as report.html and report.md.

Same shape as a run's report (:mod:`helpers.workbook.report`): the first screen is the verdict sentence and the
notebook to open next; then the ranks (a stacked bar of each rank's phases and a table), the slow-rank finding,
the top operators, what the trace cannot tell, and where every figure came from (the files read, their size and
time). ``results.jsonl`` beside them holds :meth:`helpers.traces.analysis.TraceAnalysis.records`, so
``python -m helpers compare`` and notebook 10's readers see the trace's verdict as notebook 01's.

Everything is rendered in memory before the first file is written, and each file is written whole
(:func:`helpers.fsutil.write_atomic`): a failed write leaves the previous file as it was.
"""

from __future__ import annotations

import base64
import datetime as _dt
import html
import io
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from helpers.errors import OutputDirError
from helpers.fsutil import ensure_writable_dir, write_atomic
from helpers.traces.analysis import TraceAnalysis
from helpers.traces.model import DEVICE_PHASES, HOST_PHASES
from helpers.verdict import detail_lines, reason_clauses
from helpers.workbook import plots_traces
from helpers.workbook.paths import runs_dir
from helpers.workbook.plots import figure_path
from helpers.workbook.report.format import _fmt, _fmt_value, _spread_text, headline
from helpers.workbook.report.html import _CSS, _badge, _code_spans
from helpers.workbook.report.markdown import _md_table, md_code, md_code_spans, md_escape

__all__ = ["FIGURE", "TraceReport", "default_out_dir", "rank_table", "summary_lines", "to_html", "to_markdown",
           "write_trace_report"]

#: The stacked-bar figure's name (:func:`helpers.workbook.plots.figure_path` under ``trace``).
FIGURE = "rank_phases"
#: How the report defines notebook 01's figure.
_EXPOSED = ("exposed input: the median over steps of the share of the step spent waiting for data and the "
            "host-to-device copy (notebook 01's figure)")
#: Column names of the rank table, by phase.
_PHASE_COLUMNS = {"data": "data", "h2d": "h2d", "optimizer": "optimizer", "compute": "compute",
                  "comm_exposed": "comm not overlapped", "idle": "device idle", "other": "unattributed",
                  "sync_wait": "host sync wait"}


@dataclass(frozen=True)
class TraceReport:
    """The files one trace report wrote (absolute paths)."""

    folder: Path
    html: Path
    markdown: Path
    results: Path
    figure: Path


def default_out_dir(now: _dt.datetime | None = None) -> Path:
    """``<runs>/trace-<UTC time>`` (:func:`helpers.workbook.paths.runs_dir`), e.g. ``runs/trace-20250131-120000Z``;
    a ``-2``, ``-3``... suffix when that folder exists already."""
    now = now or _dt.datetime.now(_dt.timezone.utc)
    base = runs_dir() / f"trace-{now.astimezone(_dt.timezone.utc).strftime('%Y%m%d-%H%M%S')}Z"
    folder, n = base, 1
    while folder.exists():
        n += 1
        folder = base.with_name(f"{base.name}-{n}")
    return folder


# --------------------------------------------------------------------------- tables


def _ms(stat) -> str:
    return "—" if stat is None else f"{_fmt(stat.median_s * 1e3)} ms"


def _ms_iqr(stat) -> str:
    if stat is None:
        return "—"
    return f"{_fmt(stat.median_s * 1e3)} ms (IQR {_fmt(stat.p25_s * 1e3)}–{_fmt(stat.p75_s * 1e3)})"


def _exposed(r) -> str:
    if r.exposed_fraction is None:
        return "not measurable"
    spread = _spread_text({"p25": r.exposed_p25, "p75": r.exposed_p75}, "fraction")
    return f"{_fmt_value(r.exposed_fraction, 'fraction')} ({spread})"


def rank_table(a: TraceAnalysis) -> pd.DataFrame:
    """One row per rank: rank, node, steps, median step (IQR), each phase measured by some rank (median ms),
    exposed input (IQR) and the rank's verdict; the rank the job's verdict is read from is marked with "*"."""
    shown = [p for p in (*HOST_PHASES, *DEVICE_PHASES, "other", "sync_wait")
             if any(r.phases.get(p) is not None for r in a.ranks)]
    rows = []
    for i, r in enumerate(a.ranks):
        row = {"rank": r.label + (" *" if i == a.bounding and len(a.ranks) > 1 else ""),
               "steps": r.steps, "step": _ms_iqr(r.phases["step_s"])}
        row.update({_PHASE_COLUMNS[p]: _ms(r.phases.get(p)) for p in shown})
        row["exposed input"] = _exposed(r)
        # where the job's label is withheld, a rank's label is of its own steps only (it may be waiting)
        row["verdict"] = r.label_text + (" (its own steps)" if a.withheld and r.bottleneck is not None else "")
        rows.append(row)
    return pd.DataFrame(rows)


#: Characters of an operator's or kernel's name shown in the report's table (the full name stays in the JSON).
OP_NAME_CHARS = 80


def short_op_name(name: str, limit: int = OP_NAME_CHARS) -> str:
    """A kernel's or operator's name for a table: at most ``limit`` characters.

    A CUDA kernel's demangled name runs to hundreds of characters of template arguments and parameter lists
    (``void at::native::vectorized_elementwise_kernel<4, at::native::...>(int, ...)``); ``void`` is dropped, then
    each outermost ``<...>`` and ``(...)`` becomes ``<…>`` / ``(…)``, then the rest is cut with "…".
    """
    n = str(name).strip()
    if n.startswith("void "):
        n = n[5:]
    if len(n) <= limit:
        return n
    out, depth = [], 0
    for ch in n:
        if ch in "<(":
            if depth == 0:
                out.append(ch + "…")
            depth += 1
        elif ch in ">)" and depth:
            depth -= 1
            if depth == 0:
                out.append(ch)
        elif depth == 0:
            out.append(ch)
    n = "".join(out)
    return n if len(n) <= limit else n[:limit - 1] + "…"


def _ops_table(a: TraceAnalysis) -> pd.DataFrame:
    return pd.DataFrame([{"operator": short_op_name(str(o.get("name"))), "where": str(o.get("where", "")),
                          "calls": _fmt(o.get("calls")), "self time": f"{_fmt(o.get('self_ms'))} ms"}
                         for o in a.top_ops])


def _provenance_table(a: TraceAnalysis) -> pd.DataFrame:
    rows = []
    for r in a.ranks:
        p = dict(r.provenance)
        row = {"rank": r.label, "file": str(p.pop("path", p.get("source", ""))), "bytes": _fmt(p.pop("bytes", None)),
               "modified": str(p.pop("mtime", "—")), "reader": str(p.pop("reader", r.format))}
        p.pop("source", None)
        p.pop("format", None)
        row["more"] = ", ".join(f"{k} {v}" for k, v in p.items()) or "—"
        rows.append(row)
    return pd.DataFrame(rows)


def _figure_png(a: TraceAnalysis) -> bytes:
    fig = plots_traces.rank_phases(plots_traces.medians_frame(a))  # pyplot does not hold it: nothing to close
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    return buf.getvalue()


# --------------------------------------------------------------------------- text


def _slow_text(a: TraceAnalysis) -> str:
    if a.slow_rank_sentence():
        return a.slow_rank_sentence()
    r = a.ranks[0]
    if r.rank is None or not a.world_size or a.world_size <= 1:
        return "a single-process run: no ranks to compare"
    return ("one rank only: no slow rank to find (pass the traces of every rank, or the folder that holds them)")


def _measured(v) -> str:
    """``"exposed_input_fraction = 41% (IQR 40%–43%) of rank 1"``: the verdict's figure, as a run's report shows
    it (:func:`helpers.workbook.report.format.headline`)."""
    figure = headline({"value": v.value, "unit": v.unit, "spread": v.spread, "recommendation": v.recommendation})
    many = len(v.extra.get("ranks", ())) > 1
    return f"{v.metric} = {figure}" + (f" of {v.extra.get('bounding_rank')}" if many else "")


def _summary(a: TraceAnalysis) -> str:
    n = len(a.ranks)
    steps = sorted({r.steps for r in a.ranks})
    kinds = "/".join(dict.fromkeys(r.device_kind for r in a.ranks))
    fmts = "/".join(dict.fromkeys(r.format for r in a.ranks))
    return (f"{n} trace{'s' if n > 1 else ''} ({fmts}, {kinds}) · "
            f"{a.steps_text(str(steps[0]) if len(steps) == 1 else f'{steps[0]}–{steps[-1]}')}"
            f"{' per rank' if n > 1 else ''} · threshold {_fmt_value(a.threshold, 'fraction')}")


def summary_lines(a: TraceAnalysis, report: TraceReport | None = None) -> list[str]:
    """What ``python -m helpers trace`` prints: the verdict, the per-rank table, the slow ranks, what next, where
    the report is."""
    table = rank_table(a)
    cols = [str(c) for c in table.columns]
    cells = [[str(x) for x in row] for row in table.itertuples(index=False)]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    out = [a.verdict().headline(), *detail_lines(a.why()), f"Next: {a.next_text()}", "", _summary(a)]
    out += ["  ".join(c.ljust(w) for c, w in zip(cols, widths)).rstrip()]
    out += ["  ".join(x.ljust(w) for x, w in zip(row, widths)).rstrip() for row in cells]
    if len(a.ranks) > 1:
        out.append("* the job's verdict is this rank's: the slow rank where one is named, else the one the arrival "
                   "order or the least waiting points to (see Slow ranks)")
    out += ["", f"Slow ranks: {_slow_text(a)}"]
    if a.limits:
        out += ["", "What the trace cannot tell:"] + [f"- {lim}" for lim in a.limits]
    if report is not None:
        out += ["", f"Report: {report.html}", f"        {report.markdown}", f"Records: {report.results}"]
    return out


# --------------------------------------------------------------------------- renderers


def to_html(a: TraceAnalysis, figure_png: bytes | None = None) -> str:
    """The trace report as one self-contained HTML page (inline CSS, the figure as a base64 PNG, no JavaScript)."""
    e = html.escape
    v = a.verdict()
    parts = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        f"<title>Workbook trace report</title><style>{_CSS}</style></head><body>",
        "<h1>Training-performance workbook: trace report</h1>",
        f"<p class='verdict' id='verdict'>{_code_spans(v.headline())}</p>",
        "<ul class='why'>" + "".join(f"<li>{_code_spans(c)}</li>" for c in reason_clauses(a.why())) + "</ul>",
        f"<ul class='advice'><li><b>Next:</b> {_code_spans(a.next_text())}</li>"
        f"<li><b>Slow ranks:</b> {_code_spans(_slow_text(a))}</li></ul>",
        f"<p class='meta'>Measured: {e(_measured(v))} · {e(_summary(a))}</p><p class='meta'>{e(_EXPOSED)}</p>",
        "<section><h2 id='ranks'>Ranks</h2>",
    ]
    if figure_png:
        b64 = base64.b64encode(figure_png).decode("ascii")
        parts.append(f"<figure><img alt='rank phases' src='data:image/png;base64,{b64}'>"
                     "<figcaption>median phases per step, host and device side of each rank</figcaption></figure>")
    parts.append(rank_table(a).to_html(index=False, border=0, classes="ranks", escape=True))
    if len(a.ranks) > 1:
        parts.append("<p class='meta'>* the job's verdict is this rank's: the slow rank where one is named, else the "
                     "longest step (a synchronous job steps at its slowest rank's pace)</p>")
    parts.append(f"</section><section><h2 id='slow-ranks'>Slow ranks</h2><p>{_code_spans(_slow_text(a))}</p>"
                 "</section><section><h2 id='operators'>Top operators</h2>")
    if a.top_ops:
        parts.append(f"<p class='meta'>Of {e(a.job.label)}, by self time over the trace.</p>"
                     + _ops_table(a).to_html(index=False, border=0, classes="ops", escape=True))
    else:
        parts.append("<p class='missing'>The trace lists no operator times.</p>")
    parts.append("</section><section><h2 id='limits'>What the trace cannot tell</h2>")
    parts.append("<ul>" + "".join(f"<li>{_code_spans(lim)}</li>" for lim in a.limits) + "</ul>" if a.limits
                 else "<p>Nothing the readers or the analysis noted.</p>")
    parts.append("</section><section><h2 id='provenance'>Provenance</h2>"
                 + _provenance_table(a).to_html(index=False, border=0, classes="provenance", escape=True)
                 + "<p class='meta'>Every figure above is in <a href='results.jsonl'>results.jsonl</a>, each record "
                   "with the trace it was read from.</p></section></body></html>")
    return "\n".join(parts)


def to_markdown(a: TraceAnalysis, figure: str | None = None) -> str:
    """The trace report as Markdown; ``figure`` is the stacked bars' path relative to the report (None: none)."""
    v = a.verdict()
    e = md_escape
    lines = ["# Training-performance workbook: trace report", "",
             f"**Verdict: {md_code_spans(v.headline())}**", "",
             *(f"- {md_code_spans(c)}" for c in reason_clauses(a.why())), "",
             f"- Next: {md_code_spans(a.next_text())}", f"- Slow ranks: {md_code_spans(_slow_text(a))}", "",
             f"Measured: {e(_measured(v))} · {e(_summary(a))}", "", e(_EXPOSED),
             "", "## Ranks", ""]
    if figure:
        lines += [f"![rank phases]({figure})", ""]
    lines.append(_md_table(rank_table(a)))
    if len(a.ranks) > 1:
        lines += ["", "\\* the job's verdict is this rank's: the slow rank where one is named, else the one the arrival "
                  "order or the least waiting points to (in a synchronous job the longest step is the one that waits "
                  "most)"]
    lines += ["", "## Slow ranks", "", md_code_spans(_slow_text(a)), "", "## Top operators", ""]
    lines += ([f"Of {e(a.job.label)}, by self time over the trace.", "", _md_table(_ops_table(a))] if a.top_ops
              else ["The trace lists no operator times."])
    lines += ["", "## What the trace cannot tell", ""]
    lines += [f"- {md_code_spans(lim)}" for lim in a.limits] or ["Nothing the readers or the analysis noted."]
    lines += ["", "## Provenance", "", _md_table(_provenance_table(a)), "",
              f"Every figure above is in {md_code('results.jsonl')}, each record with the trace it was read from."]
    return "\n".join(lines) + "\n"


def write_trace_report(a: TraceAnalysis, out: str | Path | None = None) -> TraceReport:
    """Write report.html, report.md, results.jsonl and the figure of an analysis into ``out``.

    All four are rendered before the first is written; each is written whole through a temporary file
    (:func:`helpers.fsutil.write_atomic`), the figure and records first and report.html last.

    Parameters
    ----------
    a : TraceAnalysis
        :func:`helpers.traces.analysis.analyze`'s result.
    out : path, optional
        The folder (created); default :func:`default_out_dir`. A workbook run folder (one with ``run.json``) is
        refused, so that its own results.jsonl and report are never replaced; a folder that already holds a trace
        report is not replaced either: the new report goes to ``DIR-2`` (``-3``, ...), and the returned
        :attr:`TraceReport.folder` says where.

    Returns
    -------
    TraceReport

    Raises
    ------
    OutputDirError
        If ``out`` is a run folder, or cannot be created or written.
    OSError
        If a file cannot be written (a full disk): that file is left as it was.
    """
    folder = Path(out).expanduser() if out is not None else default_out_dir()
    if (folder / "run.json").exists():
        raise OutputDirError(f"--out {str(folder)!r} is a workbook run folder (it has run.json): the trace report "
                             "would replace its results.jsonl and report; choose another folder")
    if out is not None and any((folder / f).exists() for f in ("report.html", "report.md", "results.jsonl")):
        # an earlier report is never replaced: the new one goes beside it, in DIR-2, DIR-3, ...
        base, n = folder, 2
        while folder.exists():
            folder = base.with_name(f"{base.name}-{n}")
            n += 1
    png = _figure_png(a)
    fig_rel = figure_path(Path("."), "trace", FIGURE).as_posix()
    md, page = to_markdown(a, fig_rel), to_html(a, png)
    jsonl = "".join(r.to_json() + "\n" for r in a.records())
    folder = ensure_writable_dir(folder, what="trace report folder", hint="pass --out DIR with a folder you can write")
    fig = folder / fig_rel
    ensure_writable_dir(fig.parent, what="figures folder", hint="pass --out DIR with a folder you can write")
    write_atomic(fig, png)
    results = write_atomic(folder / "results.jsonl", jsonl)
    md_path = write_atomic(folder / "report.md", md)
    html_path = write_atomic(folder / "report.html", page)
    return TraceReport(folder=folder, html=html_path, markdown=md_path, results=results, figure=fig)
