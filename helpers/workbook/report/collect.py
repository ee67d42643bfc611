"""Reading a run folder for the report: what each notebook recorded, saved and why it is missing.

:func:`collect` gathers everything the report shows into a :class:`Report`
(one :class:`NotebookSection` per notebook) without raising on missing or
damaged inputs; the rest of this module is the logic both renderers
(:mod:`~helpers.workbook.report.markdown`, :mod:`~helpers.workbook.report.html`)
share: the overall verdict, the first-screen advice and the checklist cells.
"""

from __future__ import annotations

import io
import json
import logging
import math
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from helpers import checklist
from helpers.bottleneck import LABELS as BOTTLENECK_LABELS
from helpers.errors import ParameterError
from helpers.process import cli_command
from helpers.results import load_results
from helpers.experiments import registry
from helpers.experiments.registry import spec_for
from helpers.verdict import Action
from helpers.workbook.paths import notebooks_dir, repo_root
from helpers.workbook.report.format import _fmt, _fmt_value, _is_num, _spread_text, headline, short_reason

log = logging.getLogger(__name__)

RUN_FILE = "run.json"
RESULTS_FILE = "results.jsonl"

_BASELINE_NUMBER = checklist.BASELINE[:2]
_END_TO_END_NUMBER = checklist.END_TO_END[:2]


def checklist_items() -> tuple[tuple[str, str], ...]:
    """The workbook's checklist, from the registry: (notebook number, item name), in reading order."""
    return tuple((i.number, i.name) for i in registry.items())

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
    executed_html : Path or None
        Its HTML rendering (beside it, ``.html``), for a browser, which shows an ``.ipynb`` as raw JSON.
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
    executed_html: Path | None = None
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


# --------------------------------------------------------------------------- run folder


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

    p = run_dir.resolve()
    try:
        return p.relative_to(repo_root()).as_posix()
    except ValueError:
        return str(p)


def _label_live_points(recs: pd.DataFrame) -> pd.DataFrame:
    """Say on each "try it" row what it is: a headless repeat at the panel's initial values or a learner's live
    measurement, and whether the machine was busy over it (the record's ``extra``)."""
    if not len(recs) or "try it" not in set(recs["experiment"]):
        return recs
    recs = recs.copy()
    for i in recs.index[recs["experiment"] == "try it"]:
        extra = recs.at[i, "extra"] if isinstance(recs.at[i, "extra"], dict) else {}
        what = "live, in JupyterLab" if extra.get("interactive") else "headless repeat at the panel's initial values"
        busy = "; machine busy: noise" if extra.get("busy") else ""
        recs.at[i, "variant"] = f"{recs.at[i, 'variant']} ({what}{busy})"
    return recs


def _has_spec(nb_id: str) -> bool:
    try:
        spec_for(nb_id)
    except ParameterError:  # a notebook id this checkout has no spec for (an older or newer run)
        return False
    return True


def _notebook_file_exists(number: str) -> bool:
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
    resume = f"{cli_command()} run --resume --out {out}"
    opts = "".join(f" --{k} {shlex.quote(str(state[k]))}" for k in ("profile", "device", "job") if state.get(k))
    if state.get("data_dir"):
        opts += f" --data-dir {shlex.quote(str(state['data_dir']))}"
    declared = {p.name for p in spec_for(nb_id)} if _has_spec(nb_id) else set()
    opts += "".join(f" -p {name} {shlex.quote(str(value))}" for name, value in state.get("overrides") or ()
                    if name in declared)  # the runner refuses a -p no selected notebook declares
    new_run = f"{cli_command()} run --only {number}{opts}"
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
    if status == "skipped":  # the user's dataset raised in an earlier notebook (helpers.workbook.runner)
        msg = str((error or {}).get("message") or "skipped")
        msg = msg[0].upper() + msg[1:]
        return (f"{msg}. After fixing it: `{resume}`",
                f"{msg}; this notebook reads the same dataset, so it was not started. After fixing the sample, "
                f"continue the run with `{resume}`.")
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
    sources += list(registry.notebook_ids())
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
    names = dict(checklist_items())
    order = [num for num, _ in checklist_items()]
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
        others = _label_live_points(recs[recs["experiment"] != "verdict"]) if len(recs) else recs
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
            executed_html=(executed.with_suffix(".html") if executed is not None
                           and (run_dir / executed.with_suffix(".html")).is_file() else None),
            error=error, duration_s=(info or {}).get("duration_s"),
            missing_short=missing[0], missing=missing[1],
            cause=error_cause(error) if failed else None, error_tail=_error_tail(error) if failed else "",
        ))
    return Report(run_dir=run_dir, state=state, notes=tuple(notes), sections=tuple(sections))


def overall_verdict(report: Report) -> str:
    """One line for the top of the report (at most :data:`helpers.verdict.HEADLINE_CHARS` characters for any
    figures): the baseline's state and, if measured, the end-to-end speedup, or what to do.

    Examples: ``"host-bound baseline → 2.71x faster end to end (95% CI 2.5–2.9)"``;
    ``"host-bound baseline → no measurable speedup end to end (1.39x, 95% CI 0.06–31.43)"`` (an interval that
    includes 1); ``"host-bound baseline (exposed input 67% of each step); end to end not measured yet"``.
    """
    by_num = {s.number: s for s in report.sections}
    base = by_num[_BASELINE_NUMBER].verdict if _BASELINE_NUMBER in by_num else None
    e2e = by_num[_END_TO_END_NUMBER].verdict if _END_TO_END_NUMBER in by_num else None
    if base and base.get("recommendation") in BOTTLENECK_LABELS:
        state = f"{base['recommendation']} baseline"
    else:
        state = "baseline"
    e2e_extra = e2e.get("extra") if e2e and isinstance(e2e.get("extra"), dict) else {}
    if isinstance(e2e_extra.get("divergence"), dict) and e2e_extra["divergence"].get("baseline_diverged"):
        return f"{state} → your job diverges, in the baseline too (notebook 10): fix its training, then measure"
    base_extra = base.get("extra") if base and isinstance(base.get("extra"), dict) else {}
    if isinstance(base_extra.get("divergence"), dict):
        return "your job diverges: its loss becomes NaN or infinite in notebook 01's baseline; fix its training first"
    if e2e and e2e.get("recommendation") == "inconclusive":
        amount = f"{e2e['value']:.2f}x" if _is_num(e2e.get("value")) else "no figure"
        interval = e2e.get("spread") if isinstance(e2e.get("spread"), dict) else {}
        low, high = interval.get("ci_low"), interval.get("ci_high")
        if "measured_recommendation" not in e2e_extra and _is_num(low) and _is_num(high) and low <= 1.0 <= high:
            # notebook 10's own "inconclusive" (a quiet machine, the cross-checks passed): its interval spans 1
            return (f"{state} → end to end inconclusive: {amount} ({_spread_text(interval, e2e.get('unit'))}) spans "
                    "1; rerun with --patience")
        return f"{state} → end to end inconclusive, machine busy or its speed changed: rerun when quiet ({amount})"
    if e2e and _is_num(e2e.get("value")):
        spread = _spread_text(e2e.get("spread"), e2e.get("unit"))
        extra = e2e.get("extra") if isinstance(e2e.get("extra"), dict) else {}
        if extra.get("learning_ok") is False:  # faster, but it does not compute what the baseline computes
            return (f"{state} → leave off: {e2e['value']:.2f}x end to end" + (f" ({spread})" if spread else "")
                    + ", but its loss differs from the baseline's")
        unit = e2e.get("unit") or ""
        amount = f"{e2e['value']:.2f}x" if unit == "x" else _fmt_value(e2e["value"], unit)
        interval = e2e.get("spread") if isinstance(e2e.get("spread"), dict) else {}
        low, high = interval.get("ci_low"), interval.get("ci_high")
        if unit == "x" and _is_num(high) and high < 1.0:
            return f"{state} → slower end to end: {amount}" + (f" ({spread})" if spread else "")
        if unit == "x" and (not _is_num(low) or low <= 1.0):
            # an interval that includes 1 (or none at all) is not a measured speedup: never print "N x faster"
            return (f"{state} → no measurable speedup end to end ({amount}" + (f", {spread}" if spread else "")
                    + ")")
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


def _decisions(s: "NotebookSection") -> list[tuple[str, str | None, str | None]]:
    """(recommendation, action text, optimization name) of everything a section's verdict decides.

    The verdict itself decides its notebook's main optimization (its structured action); an optimization
    with a ``decision`` key (:class:`helpers.experiments.base.Optimization`) is decided by the mapping the verdict
    keeps under ``extra[key]`` (notebook 02's decode-once cache), listed after it when present.
    """
    v = s.verdict or {}
    main = next((o.name for o in registry.optimizations() if o.notebook == s.id and not o.decision), None)
    out = [(str(v.get("recommendation")), _action(s), main)]
    extra = v.get("extra") if isinstance(v.get("extra"), dict) else {}
    for o in registry.optimizations():
        own = extra.get(o.decision) if o.decision and o.notebook == s.id else None
        if isinstance(own, dict) and own.get("recommendation") in ("enable", "leave off"):
            action = Action.from_dict(own.get("action"))
            out.append((str(own["recommendation"]), action.text if action else f"{o.name}: {own['recommendation']}",
                        o.name))
    return out


def _end_to_end_evidence(report: Report) -> tuple[str, dict[str, dict], list[str]]:
    """Notebook 10 in this run: (state, ablation by optimization name, the optimized job's optimizations).

    ``state`` is ``"absent"`` (no end-to-end verdict), ``"inconclusive"`` (its measurement is no evidence
    either way) or ``"measured"``.
    """
    for s in report.sections:
        if s.number == _END_TO_END_NUMBER and s.verdict:
            extra = s.verdict.get("extra") if isinstance(s.verdict.get("extra"), dict) else {}
            if s.verdict.get("recommendation") == "inconclusive":
                return "inconclusive", {}, []
            abl = extra.get("ablation") if isinstance(extra.get("ablation"), dict) else {}
            opts = extra.get("optimizations") if isinstance(extra.get("optimizations"), list) else []
            return "measured", dict(abl), [str(o) for o in opts]
    return "absent", {}, []


def _isolated_only(state: str, name: str, in_job: list[str], number: str) -> str:
    """Why an "enable" rests on its own notebook's measurement only."""
    if state == "absent":
        why = f"notebook {_END_TO_END_NUMBER} did not run"
    elif state == "inconclusive":
        why = f"notebook {_END_TO_END_NUMBER} was inconclusive"
    elif name in in_job:
        why = f"in notebook {_END_TO_END_NUMBER}'s optimized job, but not ablated there"
    else:
        why = f"not in notebook {_END_TO_END_NUMBER}'s optimized job"
    return f"notebook {number}'s isolated measurement only: {why}"


def _new_run_command(state: dict, numbers) -> str:
    """The command of a new run of the notebooks ``numbers`` with this run's options (profile, device, job,
    data folder, the ``-p`` those notebooks declare): ``--resume`` cannot add a notebook to a run."""
    nums = sorted({str(n)[:2] for n in numbers})
    opts = "".join(f" --{k} {shlex.quote(str(state[k]))}" for k in ("profile", "device", "job") if state.get(k))
    if state.get("data_dir"):
        opts += f" --data-dir {shlex.quote(str(state['data_dir']))}"
    ids, declared = {i.number: i.id for i in registry.items()}, set()
    for num in nums:
        if _has_spec(ids.get(num, "")):
            declared |= {p.name for p in spec_for(ids[num])}
    opts += "".join(f" -p {name} {shlex.quote(str(value))}" for name, value in state.get("overrides") or ()
                    if name in declared)
    return f"{cli_command()} run --only {' '.join(nums)}{opts}"


def _not_measured_by_end_to_end(report: Report) -> str | None:
    """The optimizations notebook 10 left off because no verdict of this run decided them, with the command of
    a run that measures them (this run's notebooks, theirs and 10 together); None when there are none."""
    end = next((s for s in report.sections if s.number == _END_TO_END_NUMBER and s.verdict), None)
    extra = end.verdict.get("extra") if end is not None and isinstance(end.verdict.get("extra"), dict) else {}
    missing = [str(m) for m in extra.get("missing_verdicts") or () if isinstance(m, str)]
    names = [f"{o.name} ({o.notebook[:2]})" for o in registry.optimizations() if o.notebook in missing]
    if not names:
        return None
    state = report.state or {}
    ran = [str(n.get("id", ""))[:2] for n in state.get("notebooks", []) if isinstance(n, dict)]
    command = _new_run_command(state, [*ran, *(m[:2] for m in missing), _END_TO_END_NUMBER])
    return (f"{', '.join(names)} (notebook {_END_TO_END_NUMBER} enables only what a verdict of this run "
            f"recommended); measure them with `{command}`")


def _contribution_text(ev: dict) -> str:
    """The ablation figures a decision rests on: the contribution where the optimization acts, then the whole step."""
    def ratio(c, lo, hi) -> str:
        return f"{c:.2f}x" + (f", 95% CI {lo:.2f}–{hi:.2f}" if _is_num(lo) and _is_num(hi) else "")

    c = ev.get("contribution")
    step = ratio(c, ev.get("ci_low"), ev.get("ci_high")) if _is_num(c) else ""
    pc = ev.get("phase_contribution")
    if _is_num(pc) and ev.get("phases"):
        where = f"{ev['phases']} phase{'s' if '+' in str(ev['phases']) else ''} {ratio(pc, ev.get('phase_low'), ev.get('phase_high'))}"
        return f"{where}; whole step {step}" if step else where
    return step


def _end_to_end_text(ev: dict) -> str:
    """Whether notebook 10's ablation confirms a kept optimization on the whole step: "confirmed end to end by
    notebook 10" only when the whole-step contribution's 95% interval excludes 1 (``ci_low > 1``), else "not
    confirmed end to end (95% CI 0.95–1.17 includes 1)" (its own phases gained, the whole step did not show it)."""
    low, high = ev.get("ci_low"), ev.get("ci_high")
    if _is_num(low) and low > 1.0:
        return f"confirmed end to end by notebook {_END_TO_END_NUMBER}"
    if _is_num(low) and _is_num(high):
        return (f"kept by notebook {_END_TO_END_NUMBER}'s ablation on its own phases, not confirmed end to end "
                f"(whole step 95% CI {low:.2f}–{high:.2f} includes 1)")
    return f"kept by notebook {_END_TO_END_NUMBER}'s ablation on its own phases, not confirmed end to end (no " \
           "whole-step interval)"


def _advice(report: Report) -> list[tuple[str, list[str]]]:
    """(label, items) for the recommendations that ask for a change, failed notebooks and missing items.

    A failed notebook is listed under "Failed" with its error's one-line cause,
    e.g. ``"collectives (RuntimeError: ...)"``, not under "Not measured".

    An "enable" from a notebook whose optimization notebook 10 ablated in this
    run follows that end-to-end evidence: confirmed ("keep it") it stays, with
    the contribution; with no measurable contribution it moves to its own group
    (measured in isolation only, not confirmed in the job); "drop it here"
    moves it to "leave off". An "enable" that notebook 10 did not measure says
    that it rests on its notebook's isolated measurement only. "Confirmed end
    to end" is said only when the whole-step contribution's interval excludes 1
    (:func:`_end_to_end_text`).
    """
    groups: dict[str, list[str]] = {"diverges": [], "inconclusive": [], "enable": [], "unconfirmed": [],
                                    "leave off": [], "failed": [], "skipped": [], "missing": [],
                                    "not measured": []}
    state, evidence, in_job = _end_to_end_evidence(report)
    for s in report.sections:
        rec = (s.verdict or {}).get("recommendation")
        v_extra = (s.verdict or {}).get("extra") if isinstance((s.verdict or {}).get("extra"), dict) else {}
        if rec == "inconclusive" and isinstance(v_extra.get("divergence"), dict):
            groups["diverges"].append(s.item)
        elif rec == "inconclusive":
            groups["inconclusive"].append(s.item)
        elif rec in ("enable", "leave off"):
            for rec, action, name in _decisions(s):
                if not action or rec not in ("enable", "leave off"):
                    continue
                ev = evidence.get(name) if name else None
                if rec != "enable" or name is None:
                    groups[rec].append(action)
                elif ev is None:
                    groups["enable"].append(f"{action} ({_isolated_only(state, name, in_job, s.number)})")
                elif ev.get("decision") == "keep it":
                    groups["enable"].append(f"{action} ({_end_to_end_text(ev)}: contribution "
                                            f"{_contribution_text(ev)})")
                elif ev.get("decision") == "drop it here":
                    groups["leave off"].append(f"{action.split(':')[0]}: leave off (notebook {s.number} measured a "
                                               f"gain in isolation, but the end-to-end job of notebook "
                                               f"{_END_TO_END_NUMBER} was faster without it: {_contribution_text(ev)})")
                else:
                    groups["unconfirmed"].append(f"{action.split(':')[0]} (notebook {s.number} measured a gain in "
                                                 f"isolation; notebook {_END_TO_END_NUMBER}'s ablation found no "
                                                 f"measurable contribution in the job: {_contribution_text(ev)})")
        elif s.verdict is None and s.status == "failed":
            groups["failed"].append(f"{s.item} ({s.cause})" if s.cause else s.item)
        elif s.verdict is None and s.status == "skipped":
            groups["skipped"].append(s.item)
        elif s.verdict is None and s.number:
            groups["missing"].append(s.item)
    left_off = _not_measured_by_end_to_end(report)
    if left_off:
        groups["not measured"].append(left_off)
    undecided = [s.number for s in report.sections if s.number and s.item in groups["inconclusive"]]
    if undecided and report.state:  # how to measure just those again, with more repeats
        groups["inconclusive"].append(f"rerun just these when the machine is quiet, with twice the repeats: "
                                      f"`{_new_run_command(report.state, undecided)} --patience 2`")
    labels = {"diverges": "Your job diverges (its loss becomes NaN or infinite without any optimization too): fix its "
                          "training first",
              "inconclusive": "Inconclusive: the machine was busy or its speed changed while measuring (rerun when it is quiet)",
              "enable": "Enable on this machine",
              "unconfirmed": "Gain in its notebook only, not confirmed end to end (optional)",
              "leave off": "Leave off (measured: no gain here)",
              "failed": "Failed", "skipped": "Skipped: your dataset raised in an earlier notebook (see Failed)",
              "missing": "Not measured in this run",
              "not measured": f"Not measured in this run, so not enabled by notebook {_END_TO_END_NUMBER}"}
    return [(labels[k], "; ".join(v)) for k, v in groups.items() if v]


# --------------------------------------------------------------------------- checklist cells


def _batches_measured(report: Report) -> dict[int, list[str]]:
    """Batch size -> the numbers of the notebooks whose verdict measured a job at it (the ``batch_size`` stored
    with the verdict: for a user's job, the batch it really has; "not applicable" verdicts measured nothing)."""
    out: dict[int, list[str]] = {}
    for s in report.sections:
        v = s.verdict or {}
        params = v.get("parameters") if isinstance(v.get("parameters"), dict) else {}
        batch = params.get("batch_size")
        if v.get("recommendation") == "not applicable" or isinstance(batch, bool) or not isinstance(batch, int):
            continue
        out.setdefault(int(batch), []).append(s.number or s.id)
    return out


def _batch_text(report: Report) -> str:
    """"at batch size 32 (its factory's own)": the batch the run measured and where it came from ("" if unknown)."""
    batches = _batches_measured(report)
    if not batches:
        return ""
    main = max(batches, key=lambda b: len(batches[b]))
    others = "; ".join(f"{b} in notebook(s) {', '.join(nbs)}" for b, nbs in sorted(batches.items()) if b != main)
    st = report.state or {}
    set_by_p = any(isinstance(p, (list, tuple)) and p and p[0] == "batch_size" for p in st.get("overrides") or [])
    if set_by_p:
        source = "set with -p batch_size"
    elif st.get("job"):
        source = "your factory's own; -p batch_size N measures another"
    else:
        source = f"profile {st.get('profile', '?')}" if st else "the notebooks' parameters"
    return f" at batch size {main} ({source}" + (f"; {others}" if others else "") + ")"


def _job_line(report: Report) -> str:
    """Whose job the run measured, and at which batch size: the user's job spec, or the built-in PPO job."""
    spec = (report.state or {}).get("job")
    if spec:
        return (f"your job {spec}{_batch_text(report)} (notebooks that measure only the built-in job say "
                "'not applicable')")
    return f"the built-in PPO job (a multimodal policy on the embedded photos or --data-dir){_batch_text(report)}"


def _status_line(report: Report) -> tuple[str, str, str, str, str]:
    st = report.state
    device = st.get("resolved_device") or st.get("device") or "?"
    return (report.run_dir.name, str(st.get("profile", "?")), str(device), str(st.get("status", "?")),
            _fmt(st.get("duration_s")))


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
            "running": "did not finish", "skipped": "skipped"}.get(s.status, "missing")


def change_in_code(report: Report) -> tuple[str, str, list[str]]:
    """Notebook 10's "the change in your code" from its ``change in code`` record: (the sentence, the diff, the
    notes), or ("", "", []) when notebook 10 has not recorded one."""
    for s in report.sections:
        recs = s.records
        if s.id != "10_end_to_end" or not len(recs) or "extra" not in recs.columns:
            continue
        rows = recs[recs["experiment"] == "change in code"]
        for extra in rows["extra"]:
            if isinstance(extra, dict) and extra.get("text"):
                head = str(extra["text"]).split("\n", 1)[0]
                return head, str(extra.get("diff") or ""), [str(n) for n in extra.get("notes") or []]
    return "", "", []
