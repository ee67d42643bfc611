"""One report across runs: a column per run, a row per checklist item, and where the runs disagree.

``python -m helpers compare RUN_DIR [RUN_DIR ...]`` is for a room of learners (whose laptops disagree), for a
machine before and after a change, and for CPU vs GPU vs NPU. Each cell is the item's measured effect with its
interval and its verdict, as the run's own report gives it (:func:`helpers.workbook.report.format.headline`). A
row is marked when the runs' recommendations differ, and that disagreement is classed by the intervals:

- **beyond the intervals**: two runs' intervals (95% CI, or the interquartile range where a verdict gives no
  CI) do not overlap: the machines really differ on this item;
- **within the intervals**: every pair of intervals overlaps: the verdicts differ, but the measurements do not
  say the machines do (a threshold sits inside the noise);
- **no interval**: a run gave no interval to compare.

A run that was busy while it measured shows "inconclusive" in its cell, as its report does.
"""

from __future__ import annotations

import html
import itertools
import time
from dataclasses import dataclass
from pathlib import Path

from helpers.errors import ParameterError
from helpers.fsutil import write_atomic
from helpers.workbook.report.collect import Report, collect
from helpers.workbook.report.format import _is_num, headline
from helpers.workbook.report.markdown import md_escape

__all__ = ["RunsComparison", "RowComparison", "compare_runs", "write_comparison", "interval_of"]


def interval_of(verdict: dict | None) -> tuple[float, float] | None:
    """A verdict's interval: its 95% CI, else its interquartile range; None without one."""
    spread = (verdict or {}).get("spread")
    if not isinstance(spread, dict):
        return None
    for lo, hi in (("ci_low", "ci_high"), ("p25", "p75")):
        if _is_num(spread.get(lo)) and _is_num(spread.get(hi)):
            return float(spread[lo]), float(spread[hi])
    return None


@dataclass(frozen=True)
class RowComparison:
    """One checklist item across the runs.

    Attributes
    ----------
    item, notebook : str
    cells : tuple of str
        Per run: ``"<effect with interval> · <recommendation>"`` (or what is missing).
    recommendations : tuple of str or None
    disagreement : str
        ``""`` (the runs agree, or fewer than two have a verdict), ``"beyond the intervals"``,
        ``"within the intervals"`` or ``"no interval"``.
    """

    item: str
    notebook: str
    cells: tuple[str, ...]
    recommendations: tuple[str | None, ...]
    disagreement: str


@dataclass(frozen=True)
class RunsComparison:
    """The runs side by side: their headers (run, machine, profile, status) and one row per checklist item."""

    runs: tuple[Path, ...]
    headers: tuple[dict[str, str], ...]
    rows: tuple[RowComparison, ...]

    @property
    def notes(self) -> list[str]:
        """Warnings about the comparison itself: runs of different jobs or profiles measure different workloads."""
        out = []
        for key, what in (("job", "jobs"), ("profile", "profiles"),
                          ("parameters", "parameters (-p, --data-dir)")):
            values = {h.get(key, "") for h in self.headers}
            if len(values) > 1:
                out.append(f"these runs measured different {what} ({', '.join(sorted(values))}): a row compares "
                           "different workloads, so a difference there is not the machines'")
        return out


def _disagreement(verdicts: list[dict | None]) -> str:
    recs = [v.get("recommendation") for v in verdicts if v]
    if len(recs) < 2 or len(set(recs)) == 1:
        return ""
    intervals = [interval_of(v) for v in verdicts if v]
    known = [i for i in intervals if i is not None]
    if any(a[1] < b[0] or b[1] < a[0] for a, b in itertools.combinations(known, 2)):
        return "beyond the intervals"  # two runs that gave intervals already differ beyond them
    return "no interval" if len(known) < len(intervals) else "within the intervals"


def compare_runs(run_dirs: list[str | Path]) -> RunsComparison:
    """Collect each run's report and put them side by side.

    Parameters
    ----------
    run_dirs : list of path
        Two or more run folders (each with ``run.json`` or ``results.jsonl``).

    Returns
    -------
    RunsComparison

    Raises
    ------
    ParameterError
        Fewer than two folders, or one that is not a run folder.
    """
    dirs = [Path(d) for d in run_dirs]
    if len(dirs) < 2:
        raise ParameterError("compare needs at least two run folders")
    if len({d.resolve() for d in dirs}) < len(dirs):
        raise ParameterError("compare: the same run folder is given twice; give different runs")
    for d in dirs:
        if not (d / "run.json").is_file() and not (d / "results.jsonl").is_file():
            raise ParameterError(f"{d} is not a run folder (no run.json or results.jsonl)")
    reports: list[Report] = [collect(d) for d in dirs]
    headers = []
    for rep in reports:
        st = rep.state or {}
        headers.append({"run": rep.run_dir.name, "device": str(st.get("resolved_device") or st.get("device") or "?"),
                        "profile": str(st.get("profile") or "?"), "status": str(st.get("status") or "?"),
                        "job": str(st.get("job") or "built-in"),
                        "parameters": " ".join(f"-p {k} {v}" for k, v in st.get("overrides") or ())
                        + (f" --data-dir {st['data_dir']}" if st.get("data_dir") else "") or "profile's"})
    by_id = [{s.id: s for s in rep.sections} for rep in reports]
    ids = list(dict.fromkeys(s.id for rep in reports for s in rep.sections))
    rows = []
    for nb_id in ids:
        sections = [m.get(nb_id) for m in by_id]
        item = next(s.item for s in sections if s is not None)
        verdicts = [s.verdict if s is not None else None for s in sections]
        cells = tuple(f"{headline(v)} · {v.get('recommendation')}" if v else
                      (f"no verdict ({s.status})" if s is not None else "not in this run")
                      for s, v in zip(sections, verdicts))
        rows.append(RowComparison(item=item, notebook=nb_id, cells=cells,
                                  recommendations=tuple(v.get("recommendation") if v else None for v in verdicts),
                                  disagreement=_disagreement(verdicts)))
    return RunsComparison(runs=tuple(dirs), headers=tuple(headers), rows=tuple(rows))


def _markdown(c: RunsComparison) -> str:
    e = md_escape  # run names, jobs, parameters and verdicts are the users' strings
    head = [e(h["run"]) for h in c.headers]
    lines = ["# Workbook runs compared", "",
             "| | " + " | ".join(head) + " |", "|---|" + "---|" * len(head)]
    for key in ("device", "profile", "job", "parameters", "status"):
        lines.append(f"| {key} | " + " | ".join(e(h[key]) for h in c.headers) + " |")
    lines += [f"\n> Note: {e(n)}" for n in c.notes]
    lines += ["", "| item | " + " | ".join(head) + " | runs disagree? |", "|---|" + "---|" * (len(head) + 1)]
    for r in c.rows:
        mark = f"**{r.disagreement}**" if r.disagreement == "beyond the intervals" else r.disagreement or "—"
        lines.append(f"| {e(r.item)} | " + " | ".join(e(x) for x in r.cells) + f" | {mark} |")
    lines += ["", "A row is marked when the runs' recommendations differ: *beyond the intervals* when two runs' "
              "intervals (95% CI, or IQR) do not overlap (the machines really differ), *within the intervals* when "
              "they all overlap (the verdicts differ, the measurements do not say the machines do), *no interval* "
              "when a run gave none."]
    return "\n".join(lines) + "\n"


def _html(c: RunsComparison) -> str:
    e = html.escape
    head = "".join(f"<th>{e(h['run'])}</th>" for h in c.headers)
    meta = "".join(f"<tr class='meta'><td>{k}</td>" + "".join(f"<td>{e(h[k])}</td>" for h in c.headers) + "</tr>"
                   for k in ("device", "profile", "job", "parameters", "status"))
    body = "".join(
        f"<tr class='{'apart' if r.disagreement == 'beyond the intervals' else ''}'><td>{e(r.item)}</td>"
        + "".join(f"<td>{e(x)}</td>" for x in r.cells) + f"<td>{e(r.disagreement or '—')}</td></tr>"
        for r in c.rows)
    return ("<!doctype html><html><head><meta charset='utf-8'><title>Workbook runs compared</title><style>"
            "body{font-family:system-ui,sans-serif;margin:2em}table{border-collapse:collapse}"
            "td,th{border:1px solid #ccc;padding:4px 8px;vertical-align:top}tr.meta td{color:#555}"
            "tr.apart td{background:#fff3cd}</style></head><body><h1>Workbook runs compared</h1>"
            + "".join(f"<p><b>Note:</b> {e(n)}</p>" for n in c.notes) +
            f"<table><thead><tr><th></th>{head}<th>runs disagree?</th></tr></thead><tbody>{meta}{body}</tbody>"
            "</table><p>A row is marked when the runs' recommendations differ: <i>beyond the intervals</i> "
            "(highlighted) when two runs' intervals do not overlap, <i>within the intervals</i> when they all "
            "overlap, <i>no interval</i> when a run gave none.</p></body></html>\n")


def write_comparison(run_dirs: list[str | Path], out: str | Path | None = None) -> tuple[Path, Path]:
    """Compare the runs and write ``compare.html`` and ``compare.md`` into ``out``.

    Parameters
    ----------
    run_dirs : list of path
        Two or more run folders.
    out : path, optional
        Folder for the comparison (default ``compare-<date>-<time>`` beside the first run folder).

    Returns
    -------
    (Path, Path)
        The HTML and Markdown files.

    Raises
    ------
    ParameterError
        As :func:`compare_runs`.
    """
    c = compare_runs(list(run_dirs))
    folder = Path(out) if out else Path(run_dirs[0]).parent / f"compare-{time.strftime('%Y%m%d-%H%M%S')}"
    folder.mkdir(parents=True, exist_ok=True)
    folder = folder.resolve()
    h, m = folder / "compare.html", folder / "compare.md"
    write_atomic(h, _html(c))
    write_atomic(m, _markdown(c))
    return h, m
