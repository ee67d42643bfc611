"""The run report: report.md and a self-contained report.html.

The first screen answers "what should I change and why": the run's status and
a checklist table with one row per notebook (its headline figure with its
interval, the recommendation and the reason, all read from the verdict
records). Then one section per notebook: verdict, its records, its figures,
or, for a notebook that failed, the failing cell and how to rerun it.
Every number comes from results.jsonl; nothing is typed by hand.
"""

from __future__ import annotations

import base64
import html
import json
import math
from pathlib import Path

import pandas as pd

from helpers.results import load_results

RUN_FILE = "run.json"
RESULTS_FILE = "results.jsonl"


def _fmt(value, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    if isinstance(value, (int,)) and not isinstance(value, bool):
        return str(value)
    try:
        v = float(value)
    except (TypeError, ValueError):
        return str(value)
    if v == 0:
        return "0"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    if abs(v) < 0.01:
        return f"{v:.3g}"
    return f"{v:.{digits}g}"


def _spread_text(spread) -> str:
    if not isinstance(spread, dict):
        return ""
    if "ci_low" in spread and "ci_high" in spread:
        conf = spread.get("confidence", 0.95)
        return f"{int(round(100 * conf))}% CI {_fmt(spread['ci_low'])}–{_fmt(spread['ci_high'])}"
    if "p25" in spread and "p75" in spread:
        return f"IQR {_fmt(spread['p25'])}–{_fmt(spread['p75'])}"
    return ""


def headline(verdict: pd.Series | dict | None) -> str:
    """Format a verdict record's headline: "0.81 fraction (IQR ...)"; "not applicable" when it has no value."""
    if verdict is None:
        return "—"
    v = dict(verdict)
    value = v.get("value")
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "not applicable" if v.get("recommendation") == "not applicable" else "no value"
    text = f"{_fmt(v.get('value'))} {v.get('unit') or ''}".strip()
    spread = _spread_text(v.get("spread"))
    return f"{text} ({spread})" if spread else text


GLOSSARY = (
    ("headline", "the notebook's key measured figure, with its spread (IQR: the middle half of the repeats; "
                 "CI: a bootstrap confidence interval of a ratio)"),
    ("exposed input fraction", "share of a training step in which the computation waits for the input pipeline "
                               "(data loading and the host-to-device copy); above the threshold the job is "
                               "host-bound"),
    ("recommendation", "what to do on this machine, decided from the measurement: enable, leave off, not "
                       "applicable; for the baseline: host-bound or device-bound"),
)


def _context(verdict: dict | None) -> str:
    extra = (verdict or {}).get("extra")
    return str(extra.get("context", "")) if isinstance(extra, dict) else ""


def _artifacts(run_dir: Path, notebook: str) -> list[Path]:
    folder = run_dir / "artifacts" / notebook
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix in (".json", ".csv", ".gz"))[:10]


def _load_state(run_dir: Path) -> dict:
    path = run_dir / RUN_FILE
    if path.is_file():
        return json.loads(path.read_text())
    return {"notebooks": [], "status": "unknown"}


def _figures(run_dir: Path, notebook: str) -> list[Path]:
    return sorted((run_dir / "figures").glob(f"{notebook}__*.png"))


def collect(run_dir: Path) -> dict:
    """Gather what the report shows: run state, records, verdicts and figures per notebook.

    Returns
    -------
    dict
        ``{"state": dict, "records": DataFrame, "rows": [ {id, status, verdict (dict|None),
        records (DataFrame), figures [Path], error (dict|None), duration_s} ]}``.
    """
    run_dir = Path(run_dir)
    state = _load_state(run_dir)
    records = load_results(run_dir / RESULTS_FILE)
    rows = []
    ids = [n["id"] for n in state.get("notebooks", [])]
    if not ids and len(records):
        ids = sorted(records["notebook"].unique())
    by_id = {n["id"]: n for n in state.get("notebooks", [])}
    for nb_id in ids:
        recs = records[records["notebook"] == nb_id] if len(records) else records
        verdict = None
        if len(recs):
            vs = recs[recs["experiment"] == "verdict"]
            if len(vs):
                verdict = vs.iloc[-1].to_dict()
        info = by_id.get(nb_id, {})
        rows.append({
            "id": nb_id,
            "status": info.get("status", "unknown"),
            "duration_s": info.get("duration_s"),
            "error": info.get("error"),
            "verdict": verdict,
            "records": recs[recs["experiment"] != "verdict"] if len(recs) else recs,
            "figures": _figures(run_dir, nb_id),
            "artifacts": _artifacts(run_dir, nb_id),
        })
    return {"state": state, "records": records, "rows": rows}


def _records_table(recs: pd.DataFrame) -> pd.DataFrame:
    if not len(recs):
        return pd.DataFrame()
    out = pd.DataFrame({
        "experiment": recs["experiment"],
        "variant": recs["variant"],
        "metric": recs["metric"],
        "value": [_fmt(v) for v in recs["value"]],
        "unit": recs["unit"],
        "repeats": [("" if r is None or (isinstance(r, float) and math.isnan(r)) else int(r))
                    for r in recs["repeats"]],
        "spread": [_spread_text(s) for s in recs["spread"]],
    })
    return out


def _missing_text(row: dict, run_dir: Path) -> str:
    nb = row["id"]
    rerun = f"python -m helpers run --resume --out {run_dir.name if run_dir.parent.name == 'runs' else run_dir}"
    if row["status"] == "failed" and row["error"]:
        err = row["error"]
        cell = err.get("cell_index")
        where = f" in cell {cell}" if cell is not None else ""
        return (f"Failed{where}: {err.get('message', '')}. Open the executed notebook {nb}.ipynb in the run "
                f"folder to see the traceback; after fixing the cause, rerun with `{rerun}`.")
    if row["status"] in ("pending", "running", "interrupted"):
        return f"Not finished ({row['status']}). Continue the run with `{rerun}`."
    return (f"No verdict was recorded. Run it with `python -m helpers run --only {nb[:2]}` to produce one.")


def to_markdown(run_dir: Path) -> str:
    """Render the report as Markdown (figures linked by relative path)."""
    run_dir = Path(run_dir)
    data = collect(run_dir)
    st = data["state"]
    lines = ["# Training-performance workbook: run report", ""]
    lines.append(f"Run `{run_dir.name}` · profile **{st.get('profile', '?')}** · device **{st.get('resolved_device') or st.get('device', '?')}** "
                 f"· status **{st.get('status', '?')}** · {_fmt(st.get('duration_s'))} s")
    lines += ["", "## Checklist", "", "| notebook | status | headline | recommendation | why |", "|---|---|---|---|---|"]
    for row in data["rows"]:
        v = row["verdict"]
        why = (v or {}).get("reason") or _missing_text(row, run_dir)
        lines.append(f"| [{row['id']}](#{row['id']}) | {row['status']} | {headline(v)} | "
                     f"{(v or {}).get('recommendation') or '—'} | {why.replace('|', '/')} |")
    lines += ["", "How to read it: " + "; ".join(f"*{k}*: {d}" for k, d in GLOSSARY) + "."]
    for row in data["rows"]:
        lines += ["", f"## {row['id']}", ""]
        v = row["verdict"]
        if v:
            lines.append(f"**{v.get('recommendation')}**: {v.get('reason')}  ")
            lines.append(f"Headline: {v.get('metric')} = {headline(v)}")
            if _context(v):
                lines += ["", f"*Setting:* {_context(v)}"]
        else:
            lines.append(_missing_text(row, run_dir))
        for art in row["artifacts"]:
            lines += ["", f"Artifact: [{art.relative_to(run_dir).as_posix()}]({art.relative_to(run_dir).as_posix()})"]
        for fig in row["figures"]:
            lines += ["", f"![{fig.stem}]({fig.relative_to(run_dir).as_posix()})"]
        table = _records_table(row["records"])
        if len(table):
            lines += ["", f"Records ({len(table)}):", "", _md_table(table)]
    return "\n".join(lines) + "\n"


def _md_table(df: pd.DataFrame) -> str:
    cols = [str(c) for c in df.columns]
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for row in df.itertuples(index=False):
        out.append("| " + " | ".join(str(x).replace("|", "/") for x in row) + " |")
    return "\n".join(out)


_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:1em 0;font-size:0.92em}th,td{border:1px solid #ccc;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#f3f3f3}.ok{color:#1b7f3b;font-weight:600}.failed,.interrupted{color:#b00020;font-weight:600}
.rec{font-weight:600}img{max-width:100%;border:1px solid #eee;margin:0.5em 0}code{background:#f6f6f6;padding:1px 4px}
.meta{color:#555}
"""


def to_html(run_dir: Path) -> str:
    """Render the report as one self-contained HTML page (figures embedded as base64 PNG)."""
    run_dir = Path(run_dir)
    data = collect(run_dir)
    st = data["state"]
    e = html.escape
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>Workbook report {e(run_dir.name)}</title>"
             f"<style>{_CSS}</style></head><body>",
             "<h1>Training-performance workbook: run report</h1>",
             f"<p class='meta'>Run <code>{e(run_dir.name)}</code> · profile <b>{e(str(st.get('profile', '?')))}</b> · "
             f"device <b>{e(str(st.get('resolved_device') or st.get('device', '?')))}</b> · status "
             f"<span class='{e(str(st.get('status')))}'>{e(str(st.get('status', '?')))}</span> · "
             f"{e(_fmt(st.get('duration_s')))} s</p>",
             "<h2>Checklist</h2><table id='checklist'><tr><th>notebook</th><th>status</th><th>headline</th>"
             "<th>recommendation</th><th>why</th></tr>"]
    for row in data["rows"]:
        v = row["verdict"]
        why = (v or {}).get("reason") or _missing_text(row, run_dir)
        parts.append(f"<tr><td><a href='#{e(row['id'])}'>{e(row['id'])}</a></td>"
                     f"<td class='{e(row['status'])}'>{e(row['status'])}</td><td>{e(headline(v))}</td>"
                     f"<td class='rec'>{e(str((v or {}).get('recommendation') or '—'))}</td><td>{e(why)}</td></tr>")
    parts.append("</table>")
    parts.append("<p class='meta'>How to read it: " + "; ".join(f"<i>{e(k)}</i>: {e(d)}" for k, d in GLOSSARY)
                 + ".</p>")
    for row in data["rows"]:
        parts.append(f"<h2 id='{e(row['id'])}'>{e(row['id'])}</h2>")
        v = row["verdict"]
        if v:
            parts.append(f"<p><span class='rec'>{e(str(v.get('recommendation')))}</span>: {e(str(v.get('reason')))}<br>"
                         f"Headline: {e(str(v.get('metric')))} = {e(headline(v))}</p>")
            if _context(v):
                parts.append(f"<p class='meta'><i>Setting:</i> {e(_context(v))}</p>")
        else:
            parts.append(f"<p>{e(_missing_text(row, run_dir))}</p>")
        for art in row["artifacts"]:
            rel = art.relative_to(run_dir).as_posix()
            parts.append(f"<p class='meta'>Artifact: <a href='{e(rel)}'>{e(rel)}</a></p>")
        for fig in row["figures"]:
            b64 = base64.b64encode(fig.read_bytes()).decode()
            parts.append(f"<figure><img alt='{e(fig.stem)}' src='data:image/png;base64,{b64}'>"
                         f"<figcaption>{e(fig.stem.split('__', 1)[-1].replace('_', ' '))}</figcaption></figure>")
        table = _records_table(row["records"])
        if len(table):
            parts.append(f"<details><summary>Records ({len(table)})</summary>" + table.to_html(index=False, border=0)
                         + "</details>")
    parts.append("</body></html>")
    return "\n".join(parts)


def write_report(run_dir: Path) -> tuple[Path, Path]:
    """Write report.html and report.md into ``run_dir``; return their paths."""
    run_dir = Path(run_dir)
    html_path, md_path = run_dir / "report.html", run_dir / "report.md"
    md_path.write_text(to_markdown(run_dir))
    html_path.write_text(to_html(run_dir))
    return html_path, md_path
