"""Formatting shared by the Markdown and HTML renderers of the run report.

Numbers for a reader (significant digits, percents, ratios, intervals), a
verdict's headline, the checklist's short "why", and the compact table of a
notebook's records. Nothing here reads the run folder or knows about
:class:`~helpers.workbook.report.collect.Report`; both renderers and
:mod:`helpers.workbook.report.collect` import from here.
"""

from __future__ import annotations

import math
import re

import pandas as pd

from helpers.errors import ParameterError
from helpers.units import format_interval
from helpers.units import format_number as _fmt
from helpers.units import format_percent as _pct
from helpers.units import format_value as _fmt_value
from helpers.units import is_number as _is_num
from helpers.verdict import Verdict, reason_clauses, split_outside_brackets

#: Records shown per notebook section; the rest stay in results.jsonl.
MAX_RECORD_ROWS = 40
#: An experiment with more records than this (a sweep, e.g. 08's allreduce sizes) is folded to its
#: first, last, smallest and largest value; the figure and results.jsonl hold the whole series.
FOLD_EXPERIMENT_ROWS = 10
#: Longest "why" text in the checklist; the full reason stays in the notebook's section.
WHY_MAX_CHARS = 160
#: Severity levels as notebook 08 records them (``ctx.store.add("env_check", ..., "severity", 0/1/2, "level")``).
SEVERITY_NAMES = {0: "ok", 1: "warning", 2: "error"}

#: The "How to read it" line under the checklist: (term, meaning).
GLOSSARY = (
    ("effect", "the notebook's key measured figure with its spread: IQR is the middle half of the repeats, "
               "CI a bootstrap confidence interval of a ratio (a speedup whose CI includes 1 is not a "
               "measured improvement)"),
    ("exposed input", "share of a training step in which the computation waits for the input pipeline "
                      "(data loading and the host-to-device copy); at or below the threshold the job is "
                      "device-bound; above it host-bound when free input would save more than a 2x faster "
                      "compute (a third of the step or more), else balanced"),
    ("recommendation", "what to do on this machine, decided from the measurement: enable, leave off, not "
                       "applicable; for the baseline: host-bound, balanced or device-bound; inconclusive when other "
                       "processes took more than busy_cpu_share of the cores while it measured (rerun when quiet)"),
)


# --------------------------------------------------------------------------- numbers


def _spread_text(spread, unit: str | None = None) -> str:
    """The interval of a spread dict: ``95% CI 1.10–1.30`` or ``IQR 64%–70%``; "" when none
    (:func:`helpers.units.format_interval`)."""
    return format_interval(spread, unit)


def headline(verdict: pd.Series | dict | None) -> str:
    """Format a verdict's measured effect with its interval, e.g. ``"1.23x (95% CI 1.13–1.30)"``.

    Parameters
    ----------
    verdict : dict, pandas.Series or None
        A verdict record (``value``, ``unit``, ``spread``, ``recommendation``).

    Returns
    -------
    str
        ``"—"`` for no verdict, ``"not applicable"`` / ``"no value"`` for a verdict without a number;
        a ratio (unit ``x``) whose interval includes 1 reads ``"no measurable effect (4.12x, 95% CI 0.80–9.10)"``.
    """
    if verdict is None:
        return "—"
    v = dict(verdict)
    value = v.get("value")
    if not _is_num(value):
        return "not applicable" if v.get("recommendation") == "not applicable" else "no value"
    text = _fmt_value(value, v.get("unit"))
    spread = _spread_text(v.get("spread"), v.get("unit"))
    interval = v.get("spread") if isinstance(v.get("spread"), dict) else {}
    low, high = interval.get("ci_low"), interval.get("ci_high")
    if v.get("unit") == "x" and _is_num(low) and _is_num(high) and low <= 1.0 <= high:
        # the figure a "leave off" rests on is the interval, not the point: a ratio whose interval
        # includes 1 is no measured effect, however large the point estimate of a noisy run
        return f"no measurable effect ({text}, {spread})"
    return f"{text} ({spread})" if spread else text


def verdict_lines(verdict: pd.Series | dict | None) -> tuple[str, list[str]]:
    """A verdict record as the report leads with it: its one-line headline (what to do, the number, its interval;
    :meth:`helpers.verdict.Verdict.headline`) and the reason's clauses, one per line below it.

    Returns
    -------
    tuple of (str, list of str)
        ``("", [])`` for no verdict; for a record that is no valid verdict, its recommendation and its reason.
    """
    if verdict is None:
        return "", []
    v = dict(verdict)
    try:
        rebuilt = Verdict.from_record(v)
    except (ParameterError, TypeError, ValueError):
        return str(v.get("recommendation") or ""), reason_clauses(str(v.get("reason") or ""))
    return rebuilt.headline(), reason_clauses(rebuilt.reason)


def _context(verdict: dict | None) -> str:
    extra = (verdict or {}).get("extra")
    return str(extra.get("context", "")) if isinstance(extra, dict) else ""


# --------------------------------------------------------------------------- reasons


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
    clauses = [c.strip() for c in split_outside_brackets(text, ";") if c.strip()]
    out = clauses[0] if clauses else text
    if len(out) < 40 and len(clauses) > 1 and len(out) + 2 + len(clauses[1]) <= limit:
        out = f"{out}; {clauses[1]}"
    if len(out) > limit:
        head = split_outside_brackets(out, ":")[0].strip()
        if 40 <= len(head) < len(out):
            out = head
    if len(out) > limit:
        cut = out[:limit - 1]
        cut = cut[:cut.rfind(" ")] if " " in cut[limit // 2:] else cut
        out = cut.rstrip(" ,;:(") + "…"
    return out


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
