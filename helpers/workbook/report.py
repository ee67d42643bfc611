"""The run report: report.md and a self-contained report.html.

The first screen answers "what should I change on this machine, and why":
the run's overall verdict (host-bound or device-bound baseline, and the
end-to-end speedup when notebook 10 ran), then the checklist table with one
row per item of the workbook (environment check ... end to end): the measured
effect with its interval, the recommendation as a badge, the reason, and links
to the item's section and to the executed notebook in the run folder. Then one
section per notebook: its verdict sentence, its figures and a compact table of
its records.

Every number comes from ``results.jsonl`` (read with
:func:`helpers.results.load_results`); nothing is typed by hand. A notebook
without results (not part of the run, failed, interrupted, or records lost)
gets a row and a section that say what is missing and the command that
produces it; building the report never raises because of a missing or damaged
input. report.html embeds its figures as base64 PNG and its CSS inline: it
makes no network request and needs no JavaScript.
"""

from __future__ import annotations

import base64
import html
import io
import json
import logging
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from helpers import checklist
from helpers.results import load_results
from helpers.verdict import Action

__all__ = [
    "CHECKLIST",
    "NotebookSection",
    "Report",
    "collect",
    "error_cause",
    "failed_cell",
    "headline",
    "overall_verdict",
    "to_html",
    "to_markdown",
    "write_report",
]

log = logging.getLogger(__name__)

RUN_FILE = "run.json"
RESULTS_FILE = "results.jsonl"
#: Records shown per notebook section; the rest stay in results.jsonl.
MAX_RECORD_ROWS = 40
#: Sections whose records table is shown unfolded when it has at most this many rows.
OPEN_RECORD_ROWS = 8
#: An experiment with more records than this (a sweep, e.g. 08's allreduce sizes) is folded to its
#: first, last, smallest and largest value; the figure and results.jsonl hold the whole series.
FOLD_EXPERIMENT_ROWS = 10
#: Longest "why" text in the checklist; the full reason stays in the notebook's section.
WHY_MAX_CHARS = 160
#: Severity levels as notebook 08 records them (``ctx.store.add("env_check", ..., "severity", 0/1/2, "level")``).
SEVERITY_NAMES = {0: "ok", 1: "warning", 2: "error"}

#: The workbook's checklist, from the registry: notebook number -> item name, in reading order.
CHECKLIST: tuple[tuple[str, str], ...] = tuple((i.number, i.name) for i in checklist.CHECKLIST)
_BASELINE_NUMBER = checklist.item(checklist.BASELINE).number
_END_TO_END_NUMBER = checklist.item(checklist.END_TO_END).number

GLOSSARY = (
    ("effect", "the notebook's key measured figure with its spread: IQR is the middle half of the repeats, "
               "CI a bootstrap confidence interval of a ratio (a speedup whose CI includes 1 is not a "
               "measured improvement)"),
    ("exposed input", "share of a training step in which the computation waits for the input pipeline "
                      "(data loading and the host-to-device copy); above the threshold the job is host-bound"),
    ("recommendation", "what to do on this machine, decided from the measurement: enable, leave off, not "
                       "applicable; for the baseline: host-bound or device-bound"),
)

_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


# --------------------------------------------------------------------------- records


@dataclass(frozen=True)
class NotebookSection:
    """What the report shows about one notebook.

    Attributes
    ----------
    id : str
        Notebook id, e.g. ``"01_baseline_profiling"`` (the section anchor).
    number : str
        Two-digit number, e.g. ``"01"``.
    item : str
        Checklist item name, e.g. ``"baseline profiling"``.
    status : str
        ``ok``, ``failed``, ``interrupted``, ``pending``, ``running`` (from run.json),
        ``not in run`` (the run did not select it) or ``unknown`` (no run.json).
    verdict : dict or None
        The notebook's last verdict record.
    records : pandas.DataFrame
        Its other records (columns of :func:`helpers.results.load_results`).
    figures : tuple of (Path, bytes)
        Readable PNG figures, in the order the notebook saved them, with their bytes.
    bad_figures : tuple of (Path, str)
        Figure files that could not be read, with the reason.
    executed : Path or None
        The executed notebook, relative to the run folder, if it exists.
    error : dict or None
        The runner's error record for a failed notebook.
    duration_s : float or None
        How long the notebook ran, seconds.
    missing : str or None
        For a notebook without a verdict: what is missing and the command that produces it.
    missing_short : str or None
        The same in one line, for the checklist.
    cause : str or None
        For a failed notebook: the error's one-line cause (:func:`error_cause`).
    error_tail : str
        For a failed notebook: the last lines of a multi-line error message ("" if none).
    """

    id: str
    number: str
    item: str
    status: str
    verdict: dict | None
    records: pd.DataFrame
    figures: tuple = ()
    bad_figures: tuple = ()
    executed: Path | None = None
    error: dict | None = None
    duration_s: float | None = None
    missing: str | None = None
    missing_short: str | None = None
    cause: str | None = None
    error_tail: str = ""


@dataclass(frozen=True)
class Report:
    """Everything the report shows, gathered once from a run folder.

    Attributes
    ----------
    run_dir : Path
        The run folder.
    state : dict
        run.json's content (``{}`` when there is none or it cannot be read).
    notes : tuple of str
        Problems met while reading the inputs (unreadable lines, a damaged run.json).
    sections : tuple of NotebookSection
        One per checklist item, then any other notebook found in the results.
    """

    run_dir: Path
    state: dict
    notes: tuple = ()
    sections: tuple = field(default_factory=tuple)


def _fmt(value, digits: int = 3) -> str:
    """Format a number for a reader: 3 significant digits, thousands separators, "—" for none."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}" if abs(value) >= 10000 else str(value)
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


def _is_num(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _pct(fraction: float) -> str:
    """A fraction as percent, with the digits a small value needs: 77%, 2.5%, 0.1%, 0.05%, <0.001%.

    Whole percents from 10% up; two significant digits below, so that a
    value the notebook reported as "0.1%" is not shown as "0%".
    """
    p = 100 * float(fraction)
    if p == 0:
        return "0%"
    if abs(p) >= 9.95:
        return f"{p:.0f}%"
    if abs(p) < 0.001:
        return ("-" if p < 0 else "") + "<0.001%"
    return f"{p:.2g}%"


def _fmt_value(value, unit: str | None) -> str:
    """A value with its unit: fractions as percent, ratios as ``1.23x``."""
    unit = unit or ""
    if not _is_num(value):
        return "—"
    if unit == "fraction":
        return _pct(value)
    if unit == "x":
        return f"{value:.2f}x"
    if unit == "bool":
        return "yes" if value else "no"
    return f"{_fmt(value)} {unit}".strip()


def _spread_text(spread, unit: str | None = None) -> str:
    """The interval of a spread dict: ``95% CI 1.1–1.3`` or ``IQR 64–70%``; "" when none."""
    if not isinstance(spread, dict):
        return ""

    def v(x):
        if unit == "fraction":
            return _pct(x)
        if unit == "x":
            return f"{x:.2f}"
        return _fmt(x)

    if _is_num(spread.get("ci_low")) and _is_num(spread.get("ci_high")):
        conf = spread.get("confidence", 0.95)
        conf = conf if _is_num(conf) else 0.95
        return f"{int(round(100 * conf))}% CI {v(spread['ci_low'])}–{v(spread['ci_high'])}"
    if _is_num(spread.get("p25")) and _is_num(spread.get("p75")):
        return f"IQR {v(spread['p25'])}–{v(spread['p75'])}"
    return ""


def headline(verdict: pd.Series | dict | None) -> str:
    """Format a verdict's measured effect with its interval, e.g. ``"1.23x (95% CI 1.13–1.30)"``.

    Parameters
    ----------
    verdict : dict, pandas.Series or None
        A verdict record (``value``, ``unit``, ``spread``, ``recommendation``).

    Returns
    -------
    str
        ``"—"`` for no verdict, ``"not applicable"`` / ``"no value"`` for a verdict without a number.
    """
    if verdict is None:
        return "—"
    v = dict(verdict)
    value = v.get("value")
    if not _is_num(value):
        return "not applicable" if v.get("recommendation") == "not applicable" else "no value"
    text = _fmt_value(value, v.get("unit"))
    spread = _spread_text(v.get("spread"), v.get("unit"))
    return f"{text} ({spread})" if spread else text


def _context(verdict: dict | None) -> str:
    extra = (verdict or {}).get("extra")
    return str(extra.get("context", "")) if isinstance(extra, dict) else ""


def _artifacts(run_dir: Path, notebook: str) -> list[Path]:
    folder = run_dir / "artifacts" / notebook
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix in (".json", ".csv", ".gz"))[:10]


def _load_state(run_dir: Path) -> tuple[dict, list[str]]:
    """run.json's content and any note about it; ``{}`` when absent or unreadable."""
    path = run_dir / RUN_FILE
    if not path.is_file():
        return {}, []
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(state, dict):
            raise ValueError(f"expected a JSON object, got {type(state).__name__}")
        if not isinstance(state.get("notebooks", []), list):
            raise ValueError("its 'notebooks' entry is not a list")
        return state, []
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        log.warning("cannot read %s: %s", path, exc)
        return {}, [f"run.json could not be read ({type(exc).__name__}: {exc}); notebook statuses are unknown."]


def _unreadable_lines(path: Path, n_records: int) -> int:
    """How many non-blank lines of the results file load_results left out."""
    try:
        raw = path.read_bytes()
    except OSError:
        return 0
    return max(0, sum(1 for line in raw.split(b"\n") if line.strip()) - n_records)


_SAVE_FIGURE = re.compile(r"""save_figure\(\s*[^,()]+,\s*[^,()]+,\s*(?:name\s*=\s*)?(["'])([^"'\\]+)\1""")


def _load_notebook(path: Path | None) -> dict | None:
    """An executed notebook's JSON (``cells`` list), or None when absent or unreadable."""
    if path is None:
        return None
    try:
        nb = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        log.info("cannot read notebook %s: %s", path, exc)
        return None
    return nb if isinstance(nb, dict) and isinstance(nb.get("cells"), list) else None


def _cell_text(cell) -> str:
    src = cell.get("source", "") if isinstance(cell, dict) else ""
    return "".join(src) if isinstance(src, list) else str(src)


def _figure_names_in_order(nb: dict | None) -> list[str]:
    """Figure names in the order the notebook saves them: each ``save_figure(fig, ctx, "name")`` call, cell by cell.

    The names are made file-safe as :func:`helpers.workbook.plots.figure_path` does.
    """
    names: list[str] = []
    for cell in (nb or {}).get("cells", []):
        if isinstance(cell, dict) and cell.get("cell_type") == "code":
            for m in _SAVE_FIGURE.finditer(_cell_text(cell)):
                safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in m.group(2))
                if safe not in names:
                    names.append(safe)
    return names


def _figure_order(paths: list[Path], notebook: str, nb: dict | None) -> list[Path]:
    """Sort figure files in the order the notebook saved them.

    First the figures named by a ``save_figure`` call of the notebook, in the
    order of those calls (robust to copying the run folder, which loses file
    times); then any other figure by modification time, then name.
    """
    rank = {name: i for i, name in enumerate(_figure_names_in_order(nb))}

    def key(path: Path):
        name = path.stem[len(notebook) + 2:]
        try:
            mtime = path.lstat().st_mtime
        except OSError:
            mtime = math.inf
        return (rank.get(name, len(rank)), mtime if name not in rank else 0.0, path.name)

    return sorted(paths, key=key)


def _read_figures(run_dir: Path, notebook: str,
                  nb: dict | None = None) -> tuple[list[tuple[Path, bytes]], list[tuple[Path, str]]]:
    """Readable PNG figures of ``notebook`` (path, bytes) and the unreadable ones (path, reason).

    Both lists are in the order the notebook saved the figures (see :func:`_figure_order`);
    ``nb`` is the executed notebook's JSON, when there is one.
    """
    from PIL import Image, UnidentifiedImageError

    good, bad = [], []
    for path in _figure_order(list((run_dir / "figures").glob(f"{notebook}__*.png")), notebook, nb):
        try:
            data = path.read_bytes()
            if not data.startswith(_PNG_MAGIC):
                raise ValueError(f"not a PNG file ({len(data)} bytes)")
            with Image.open(io.BytesIO(data)) as im:
                im.verify()
        except FileNotFoundError:
            bad.append((path, "the file is missing (a dangling link?)"))
            continue
        except (OSError, ValueError, UnidentifiedImageError, SyntaxError) as exc:
            bad.append((path, f"{type(exc).__name__}: {exc}"))
            continue
        good.append((path, data))
    return good, bad


# --------------------------------------------------------------------------- failures

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
#: Longest error cause quoted in one line, characters.
MAX_CAUSE_CHARS = 300
#: Last lines of a multi-line error shown (folded) in a failed notebook's section.
MAX_ERROR_LINES = 30


def error_cause(error: dict | None) -> str:
    """The one-line cause of a runner error record: exception type and the first line of its message.

    Parameters
    ----------
    error : dict or None
        run.json's ``error`` entry of a failed notebook (``ename``, ``evalue``,
        ``type``, ``message``).

    Returns
    -------
    str
        E.g. ``"RuntimeError: collective job 'ddp' failed: rank 1 exited with code -6."``;
        a trailing lead-in sentence that ends with ":" (``"Last output:"``) is dropped,
        and a cause longer than :data:`MAX_CAUSE_CHARS` is cut at a word, with "…".
    """
    err = error or {}
    ename = str(err.get("ename") or "").strip()
    text = _ANSI.sub("", str(err.get("evalue") if ename else err.get("message") or ""))
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    if first.endswith(":"):
        head, sep, _ = first[:-1].rpartition(". ")
        if sep:
            first = head + "."
    kind = ename or str(err.get("type") or "")
    if kind and not first.startswith(kind):
        first = f"{kind}: {first}" if first else kind
    first = first or "no error message"
    if len(first) > MAX_CAUSE_CHARS:
        first = first[:MAX_CAUSE_CHARS].rsplit(" ", 1)[0].rstrip(",;:") + " …"
    return first


def _error_tail(error: dict | None) -> str:
    """The last lines of a multi-line error message ("" for a one-line message)."""
    err = error or {}
    text = _ANSI.sub("", str(err.get("evalue") or err.get("message") or ""))
    lines = [line.rstrip() for line in text.strip().splitlines()]
    if len(lines) <= 1:
        return ""
    return "\n".join(lines[-MAX_ERROR_LINES:])


def failed_cell(error: dict | None, nb: dict | None) -> str:
    """Name the cell that failed the way the user sees it in the executed notebook.

    Parameters
    ----------
    error : dict or None
        run.json's ``error`` entry (``exec_count``, ``cell_index``, ``cell_source``).
    nb : dict or None
        The executed notebook's JSON.

    Returns
    -------
    str
        ``"In [8], under “2. Allreduce bandwidth”"`` (execution count and the nearest
        markdown heading above the cell); without the notebook, ``"In [8]"`` or the cell's
        first line; ``""`` when nothing is known.
    """
    err = error or {}
    count = err.get("exec_count")
    count = count if isinstance(count, int) and not isinstance(count, bool) else None
    cells = [c for c in (nb or {}).get("cells", []) if isinstance(c, dict)]
    pos = None
    if count is not None:
        pos = next((i for i, c in enumerate(cells)
                    if c.get("cell_type") == "code" and c.get("execution_count") == count), None)
    if pos is None:  # papermill marks the failed cell with a tagged markdown cell just above it
        for i, c in enumerate(cells[:-1]):
            tags = (c.get("metadata") or {}).get("tags") or []
            if "papermill-error-cell-tag" in tags and 'id="papermill-error-cell"' in _cell_text(c):
                pos = i + 1
                if count is None and isinstance(cells[pos].get("execution_count"), int):
                    count = cells[pos]["execution_count"]
                break
    first_line = next((ln.strip() for ln in str(err.get("cell_source") or "").splitlines()
                       if ln.strip() and not ln.lstrip().startswith("#")), "")
    if count is not None:
        where = f"In [{count}]"
    elif first_line:
        where = f"the cell that starts `{first_line[:80]}`"
    elif _is_num(err.get("cell_index")):
        where = f"cell {err['cell_index']}"
    else:
        return ""
    heading = ""
    for c in reversed(cells[:pos] if pos is not None else []):
        if c.get("cell_type") == "markdown":
            h = next((ln.lstrip("#").strip() for ln in reversed(_cell_text(c).splitlines())
                      if ln.startswith("#")), "")
            if h:
                heading = h
                break
    return f"{where}, under “{heading}”" if heading else where


def _display_dir(run_dir: Path) -> str:
    """The run folder as a user types it from the repository root (where ``make`` runs)."""
    from helpers.workbook.paths import repo_root

    p = run_dir.resolve()
    try:
        return p.relative_to(repo_root()).as_posix()
    except ValueError:
        return str(p)


def _notebook_file_exists(number: str) -> bool:
    from helpers.workbook.paths import notebooks_dir

    return any(notebooks_dir().glob(f"{number}_*.ipynb"))


def _missing_text(*, nb_id: str, number: str, status: str, error: dict | None, n_records: int,
                  run_dir: Path, state: dict, nb: dict | None = None) -> tuple[str, str]:
    """Say what is missing for a notebook without a verdict, and the exact command that produces it.

    Returns
    -------
    tuple of str
        ``(short, long)``: one line for the checklist, and the full explanation for the section.
    """
    out = _display_dir(run_dir)
    resume = f"python -m helpers run --resume --out {out}"
    opts = "".join(f" --{k} {state[k]}" for k in ("profile", "device") if state.get(k))
    new_run = f"python -m helpers run --only {number}{opts}"
    no_file = ("" if _notebook_file_exists(number) else
               f" This checkout has no notebooks/{number}_*.ipynb yet: update it first.")
    if status == "failed":
        cell = failed_cell(error, nb)
        where = f" at {cell}" if cell else ""
        msg = error_cause(error)
        end = "" if msg.endswith((".", "…", "!", "?")) else "."
        return (f"Failed{where}: {msg}{end} Rerun: `{resume}`",
                f"Failed{where}: {msg}{end} The traceback is in the executed notebook {nb_id}.ipynb and the "
                f"kernel's log in logs/{nb_id}.log of the run folder; after fixing the cause, rerun it with "
                f"`{resume}`.")
    if status in ("pending", "running", "interrupted"):
        return (f"Did not finish ({status}). Continue: `{resume}`",
                f"Did not finish (status: {status}); its records are incomplete or absent. "
                f"Continue the run with `{resume}`.")
    if status == "not in run":
        only = " ".join(str(x) for x in state.get("only") or [])
        why = f"the run selected only notebooks {only} (--only)" if only else "the run did not include it"
        return (f"Not in this run. Produce it: `{new_run}`",
                f"No results: {why}. Produce them with `{new_run}` (a new run folder: --resume cannot add a "
                f"notebook to an existing run).{no_file}")
    if status == "ok":
        have = f"{n_records} record(s) but no verdict" if n_records else "no records"
        return (f"Finished, but no verdict recorded. Rerun: `{new_run}`",
                f"The notebook finished but results.jsonl holds {have} for it (records lost or cut off?). "
                f"Produce them again with `{new_run}`.{no_file}")
    # no run.json: a folder of records only (e.g. runs/interactive)
    return (f"No results. Produce them: `{new_run}`",
            f"No results for this notebook in results.jsonl. Produce them with `{new_run}`, or run "
            f"notebooks/{nb_id}.ipynb top to bottom in JupyterLab.{no_file}")


def _section_ids(state: dict, records: pd.DataFrame) -> dict[str, str]:
    """Notebook number -> id, from run.json, the records and the checklist registry."""
    ids: dict[str, str] = {}
    sources = [n.get("id") for n in state.get("notebooks", []) if isinstance(n, dict)]
    sources += list(records["notebook"].unique()) if len(records) else []
    sources += list(checklist.notebook_ids())
    for nb_id in sources:
        if isinstance(nb_id, str) and nb_id[:2].isdigit():
            ids.setdefault(nb_id[:2], nb_id)
    return ids


def collect(run_dir: Path) -> Report:
    """Gather what the report shows from a run folder, without raising on missing or damaged inputs.

    Parameters
    ----------
    run_dir : Path
        A run folder: ``run.json`` (optional), ``results.jsonl`` (optional),
        ``figures/<notebook>__<name>.png``, executed notebooks.

    Returns
    -------
    Report
        One :class:`NotebookSection` per checklist item (in checklist order),
        then one per other notebook that has records.

    Raises
    ------
    helpers.errors.DataError
        Only if ``results.jsonl`` exists but is a folder or cannot be read at all.
    """
    run_dir = Path(run_dir)
    state, notes = _load_state(run_dir)
    results_path = run_dir / RESULTS_FILE
    records = load_results(results_path)
    if results_path.is_file():
        lost = _unreadable_lines(results_path, len(records))
        if lost:
            notes.append(f"{lost} line(s) of results.jsonl could not be read (cut off by an interrupted write, "
                         f"or not a valid record) and are left out.")
    elif state:
        notes.append("The run folder has no results.jsonl: no notebook recorded a result yet.")
    by_id = {n.get("id"): n for n in state.get("notebooks", []) if isinstance(n, dict)}
    ids = _section_ids(state, records)
    names = dict(CHECKLIST)
    order = [num for num, _ in CHECKLIST]
    order += sorted(num for num in ids if num not in names)
    extra_ids = [nb for nb in (records["notebook"].unique() if len(records) else [])
                 if not (isinstance(nb, str) and nb[:2].isdigit())]

    sections = []
    for key in order + extra_ids:
        nb_id = ids.get(key, key)
        number = nb_id[:2] if nb_id[:2].isdigit() else ""
        recs = records[records["notebook"] == nb_id] if len(records) else records
        verdict = None
        vs = recs[recs["experiment"] == "verdict"] if len(recs) else recs
        if len(vs):
            verdict = {k: (None if isinstance(v, float) and math.isnan(v) else v)
                       for k, v in vs.iloc[-1].to_dict().items()}
        info = by_id.get(nb_id)
        if info is not None:
            status = str(info.get("status", "unknown"))
        elif state:
            status = "not in run"
        else:
            status = "unknown" if not len(recs) else "recorded"
        executed = None
        out = (info or {}).get("output")
        for cand in ([Path(out)] if out else []) + [run_dir / f"{nb_id}.ipynb"]:
            cand = cand if cand.is_absolute() else run_dir / cand
            if cand.is_file():
                try:
                    executed = cand.resolve().relative_to(run_dir.resolve())
                except ValueError:
                    continue
                break
        nb = _load_notebook(run_dir / executed if executed is not None else None)
        figures, bad = _read_figures(run_dir, nb_id, nb)
        others = recs[recs["experiment"] != "verdict"] if len(recs) else recs
        error = (info or {}).get("error")
        error = error if isinstance(error, dict) else None
        missing = (None, None)
        if verdict is None:
            missing = _missing_text(nb_id=nb_id, number=number, status=status, error=error,
                                    n_records=len(recs), run_dir=run_dir, state=state, nb=nb)
        failed = status == "failed"
        sections.append(NotebookSection(
            id=nb_id, number=number, item=names.get(number, nb_id), status=status, verdict=verdict,
            records=others, figures=tuple(figures), bad_figures=tuple(bad), executed=executed,
            error=error, duration_s=(info or {}).get("duration_s"),
            missing_short=missing[0], missing=missing[1],
            cause=error_cause(error) if failed else None, error_tail=_error_tail(error) if failed else "",
        ))
    return Report(run_dir=run_dir, state=state, notes=tuple(notes), sections=tuple(sections))


def overall_verdict(report: Report) -> str:
    """One sentence for the top of the report: the baseline's state and, if measured, the end-to-end speedup.

    Examples: ``"host-bound baseline → 2.71x faster end to end (95% CI 2.5–2.9)"``;
    ``"host-bound baseline (exposed input 67% of each step); end to end not measured yet"``.
    """
    by_num = {s.number: s for s in report.sections}
    base = by_num[_BASELINE_NUMBER].verdict if _BASELINE_NUMBER in by_num else None
    e2e = by_num[_END_TO_END_NUMBER].verdict if _END_TO_END_NUMBER in by_num else None
    if base and base.get("recommendation") in ("host-bound", "device-bound"):
        state = f"{base['recommendation']} baseline"
    else:
        state = "baseline"
    if e2e and _is_num(e2e.get("value")):
        spread = _spread_text(e2e.get("spread"), e2e.get("unit"))
        unit = e2e.get("unit") or ""
        amount = f"{e2e['value']:.2f}x" if unit == "x" else _fmt_value(e2e["value"], unit)
        return f"{state} → {amount} faster end to end" + (f" ({spread})" if spread else "")
    if base:
        if _is_num(base.get("value")) and base.get("unit") == "fraction":
            detail = f" (exposed input {_fmt_value(base['value'], 'fraction')} of each step)"
        elif _is_num(base.get("value")):
            detail = f" ({base.get('metric')} {headline(base)})"
        else:
            detail = ""
        return f"{state}{detail}; end to end not measured yet (notebook 10)"
    status = report.state.get("status")
    return "no baseline measured yet (notebook 01)" + (f"; run status: {status}" if status else "")


def _advice(report: Report) -> list[tuple[str, list[str]]]:
    """(label, items) for the recommendations that ask for a change, failed notebooks and missing items.

    A failed notebook is listed under "Failed" with its error's one-line cause,
    e.g. ``"collectives (RuntimeError: ...)"``, not under "Not measured".
    """
    groups: dict[str, list[str]] = {"enable": [], "leave off": [], "failed": [], "missing": []}
    for s in report.sections:
        rec = (s.verdict or {}).get("recommendation")
        if rec in ("enable", "leave off"):
            action = _action(s)
            if action:
                groups[rec].append(action)
        elif s.verdict is None and s.status == "failed":
            groups["failed"].append(f"{s.item} ({s.cause})" if s.cause else s.item)
        elif s.verdict is None and s.number:
            groups["missing"].append(s.item)
    labels = {"enable": "Enable on this machine", "leave off": "Leave off (measured: no gain here)",
              "failed": "Failed", "missing": "Not measured in this run"}
    return [(labels[k], "; ".join(v)) for k, v in groups.items() if v]


# --------------------------------------------------------------------------- tables


def _fold_sweeps(recs: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """Fold each (experiment, metric) series longer than FOLD_EXPERIMENT_ROWS to first, last, min and max.

    Returns the kept records (original order, a ``_fold`` column naming the
    folded rows' role) and one note per folded series.
    """
    keep, notes = [], []
    recs = recs.reset_index(drop=True).copy()
    recs["_fold"] = ""
    keys = list(zip(recs["experiment"], recs["metric"]))
    for key in dict.fromkeys(keys):
        idx = [i for i, k in enumerate(keys) if k == key]
        if len(idx) <= FOLD_EXPERIMENT_ROWS:
            keep += idx
            continue
        vals = pd.to_numeric(recs.loc[idx, "value"], errors="coerce")
        roles = {idx[0]: ["first"], idx[-1]: ["last"]}
        if vals.notna().any():
            roles.setdefault(int(vals.idxmin()), []).append("min")
            roles.setdefault(int(vals.idxmax()), []).append("max")
        for i, r in roles.items():
            recs.loc[i, "_fold"] = "/".join(r)
        keep += sorted(roles)
        notes.append(f"{key[0]} {key[1]}: {len(idx)} rows folded to first, last, min and max")
    if notes:
        notes.append("every row is in results.jsonl")
    return recs.loc[sorted(keep)], notes


def _value_text(value, unit, metric, extra) -> str:
    """A record's value: severity levels by name, a dimensionless unit ("1", "") left out."""
    if unit == "level" and metric == "severity":
        named = extra.get("severity") if isinstance(extra, dict) else None
        if isinstance(named, str) and named:
            return named
        if _is_num(value) and int(value) in SEVERITY_NAMES:
            return SEVERITY_NAMES[int(value)]
    if not _is_num(value):
        return "—"
    return _fmt_value(value, "" if unit in ("1", "dimensionless") else unit)


def _record_interval(spread, unit) -> str:
    """The record's interval; for a rate, the IQR of its time per call when the spread holds one."""
    text = _spread_text(spread, unit)
    if text or not isinstance(spread, dict):
        return text
    lo, hi = spread.get("time_p25_s"), spread.get("time_p75_s")
    if _is_num(lo) and _is_num(hi):
        scale, name = (1e3, "ms") if hi >= 1e-3 else (1e6, "µs")
        return f"time IQR {_fmt(lo * scale)}–{_fmt(hi * scale)} {name}"
    return ""


def _records_table(recs: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """Compact table of a notebook's records and the notes on what it folded.

    Columns: experiment, variant, metric, value with unit, interval, n.
    Sweeps longer than FOLD_EXPERIMENT_ROWS are folded (see ``_fold_sweeps``),
    then at most MAX_RECORD_ROWS rows are kept.
    """
    if not len(recs):
        return pd.DataFrame(), []
    recs, notes = _fold_sweeps(recs)
    if len(recs) > MAX_RECORD_ROWS:
        notes.append(f"first {MAX_RECORD_ROWS} rows shown")
        recs = recs.iloc[:MAX_RECORD_ROWS]
    extras = list(recs["extra"]) if "extra" in recs.columns else [None] * len(recs)
    return pd.DataFrame({
        "experiment": list(recs["experiment"]),
        "variant": [f"{v} ({f})" if f else v for v, f in zip(recs["variant"], recs["_fold"])],
        "metric": list(recs["metric"]),
        "value": [_value_text(v, u, m, x) for v, u, m, x in zip(recs["value"], recs["unit"], recs["metric"], extras)],
        "interval": [_record_interval(s, u) for s, u in zip(recs["spread"], recs["unit"])],
        "n": [("" if r is None or (isinstance(r, float) and math.isnan(r)) else int(r)) for r in recs["repeats"]],
    }), notes


def _records_caption(n_all: int, notes: list[str]) -> str:
    """``"Records (45; allreduce: 26 rows folded to first, last, min and max; ...)"``."""
    return f"Records ({n_all}" + "".join(f"; {b}" for b in notes) + ")"


def _md_cell(text) -> str:
    return str(text).replace("|", "/").replace("\n", " ")


def _md_table(df: pd.DataFrame) -> str:
    cols = [str(c) for c in df.columns]
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for row in df.itertuples(index=False):
        out.append("| " + " | ".join(_md_cell(x) for x in row) + " |")
    return "\n".join(out)


def _status_line(report: Report) -> tuple[str, str, str, str, str]:
    st = report.state
    device = st.get("resolved_device") or st.get("device") or "?"
    return (report.run_dir.name, str(st.get("profile", "?")), str(device), str(st.get("status", "?")),
            _fmt(st.get("duration_s")))


def _top_level_parts(text: str, sep: str) -> list[str]:
    """Split ``text`` at ``sep`` where it is outside parentheses and brackets."""
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth = max(0, depth - 1)
        if ch == sep and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return parts


def _drop_long_parentheticals(text: str, longest: int = 50) -> str:
    """Remove top-level ``( ... )`` asides longer than ``longest`` characters (details the section keeps)."""
    out, depth, start = [], 0, 0
    i = 0
    for i, ch in enumerate(text):
        if ch == "(":
            if depth == 0:
                start = i
            depth += 1
        elif ch == ")" and depth:
            depth -= 1
            if depth == 0:
                aside = text[start:i + 1]
                if len(aside) <= longest:
                    out.append(aside)
                continue
        if depth == 0:
            out.append(ch)
    if depth:  # unbalanced: keep the rest as it was
        out.append(text[start:])
    return re.sub(r"\s+([,;:])", r"\1", re.sub(r"\s{2,}", " ", "".join(out))).strip()


def short_reason(reason: str, limit: int = WHY_MAX_CHARS) -> str:
    """The first clause of a verdict's reason, for the checklist: the decision and its figure.

    Long parenthetical asides are dropped, the text is cut at the first
    top-level ``;`` (taking the next clause too when the first is under 40
    characters), then, if still longer than ``limit``, at the first
    top-level ``:``, and finally at a word boundary with "…".

    Parameters
    ----------
    reason : str
        The full reason, as the notebook recorded it.
    limit : int
        Most characters returned.

    Returns
    -------
    str
        At most ``limit`` characters.
    """
    text = " ".join(str(reason or "").split())
    if len(text) <= limit and ";" not in text:
        return text
    text = _drop_long_parentheticals(text)
    clauses = [c.strip() for c in _top_level_parts(text, ";") if c.strip()]
    out = clauses[0] if clauses else text
    if len(out) < 40 and len(clauses) > 1 and len(out) + 2 + len(clauses[1]) <= limit:
        out = f"{out}; {clauses[1]}"
    if len(out) > limit:
        head = _top_level_parts(out, ":")[0].strip()
        if 40 <= len(head) < len(out):
            out = head
    if len(out) > limit:
        cut = out[:limit - 1]
        cut = cut[:cut.rfind(" ")] if " " in cut[limit // 2:] else cut
        out = cut.rstrip(" ,;:(") + "…"
    return out


def _why(s: NotebookSection) -> str:
    reason = (s.verdict or {}).get("reason")
    return short_reason(str(reason)) if reason else str(s.missing_short or "")


def _action(s: NotebookSection) -> str | None:
    """What a verdict decides, as its notebook wrote it: ``"bf16 autocast: enable"``, ``"batch size 32 → 80"``.

    Read from the verdict's structured action (:class:`helpers.verdict.Action`, ``extra["action"]``); a
    verdict recorded without one (an older results file) falls back to the item name with the
    recommendation. Returns None for the end-to-end notebook, whose verdict is the run's summary.
    """
    v = s.verdict or {}
    if s.number == _END_TO_END_NUMBER:
        return None
    extra = v.get("extra") if isinstance(v.get("extra"), dict) else {}
    action = Action.from_dict(extra.get("action"))
    if action is not None:
        return action.text
    return f"{s.item}: {v.get('recommendation')}"


def _rec_text(s: NotebookSection) -> str:
    if s.verdict is not None:
        return str(s.verdict.get("recommendation") or "no recommendation")
    return {"failed": "failed", "interrupted": "interrupted", "pending": "not run",
            "running": "did not finish"}.get(s.status, "missing")


# --------------------------------------------------------------------------- Markdown


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
              if rep.state else f"Folder `{name}`: records only (no run.json, e.g. notebooks run by hand)")]
    for label, items in _advice(rep):
        lines += ["", f"- {label}: {items}"]
    for note in rep.notes:
        lines += ["", f"> Note: {note}"]
    lines += ["", "## Checklist", "", "| item | measured effect | recommendation | why | notebook |",
              "|---|---|---|---|---|"]
    for s in rep.sections:
        link = f"[{s.executed.as_posix()}]({s.executed.as_posix()})" if s.executed else "—"
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
            lines += ["", f"Executed notebook: [{s.executed.as_posix()}]({s.executed.as_posix()})"]
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


# --------------------------------------------------------------------------- HTML


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
.b-missing,.b-not-run,.b-did-not-finish,.b-interrupted{background:#fef9c3;color:#854d0e;border-color:#fde047}
.b-failed{background:#fee2e2;color:#991b1b;border-color:#fca5a5}
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
            parts.append(f"<p>{e(str(s.verdict.get('reason') or ''))}</p>"
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
            links.append(f"executed notebook <a href='{e(s.executed.as_posix())}'>{e(s.executed.as_posix())}</a>")
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
    parts.append("</body></html>")
    return "\n".join(parts)


def write_report(run_dir: Path) -> tuple[Path, Path]:
    """Write ``report.html`` and ``report.md`` into ``run_dir``.

    Parameters
    ----------
    run_dir : Path
        The run folder (see :func:`collect`).

    Returns
    -------
    tuple of Path
        ``(report.html, report.md)``.

    Raises
    ------
    OSError
        If the files cannot be written.
    """
    run_dir = Path(run_dir)
    rep = collect(run_dir)
    html_path, md_path = run_dir / "report.html", run_dir / "report.md"
    md_path.write_text(to_markdown(rep), encoding="utf-8")
    html_path.write_text(to_html(rep), encoding="utf-8")
    return html_path, md_path
