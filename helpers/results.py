"""The result record schema and an append-only JSON-lines results store.

Every number a notebook reports is a :class:`Record`: which notebook and
experiment, which variant, the metric with its value and unit, how many
repeats and their spread, the device, the notebook's parameters, the library
versions and the time. Notebooks append records through a
:class:`ResultsStore`; the report reads them back with :func:`load_results`.
No number is typed by hand into prose.

File format: UTF-8 JSON lines, one record per line, appended and
``fsync``-ed one at a time, so an interrupted run keeps every record that
finished. A line cut short by a crash is skipped (with a warning) on reading.
Values must be finite: NaN and infinity are refused when a record is made, so
they never enter the store.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import importlib.metadata
import json
import logging
import math
import numbers
import os
import platform
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePath
from typing import TYPE_CHECKING, Any

import helpers
from helpers.errors import DataError, OutputDirError, ParameterError
from helpers.timing import Comparison, Measurement
from helpers.verdict import RECOMMENDATIONS, Action, Verdict

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

__all__ = [
    "RECOMMENDATIONS",
    "Record",
    "Records",
    "ResultsStore",
    "load_results",
    "verdicts",
    "versions",
    "RECORD_COLUMNS",
]

logger = logging.getLogger(__name__)


#: Distributions whose versions are recorded, as ``key: distribution name``.
_VERSION_DISTS = {
    "torch": "torch",
    "torch_npu": "torch_npu",
    "numpy": "numpy",
    "pillow": "pillow",
}
#: The distribution name of this project (pyproject.toml ``[project] name``).
_PROJECT_DIST = "training-perf-workbook"


def _utc_now() -> str:
    """Current time as ISO-8601 UTC with milliseconds, e.g. ``2025-01-31T12:00:00.123+00:00``."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds")


def versions() -> dict[str, str | None]:
    """Return the versions that matter for a measurement.

    Reads installed distribution metadata with :mod:`importlib.metadata`; it
    never imports torch or torch_npu (importing torch_npu without a working
    CANN toolkit can fail or take seconds; huggingface/accelerate#3754).

    Returns
    -------
    dict
        Keys ``python``, ``torch``, ``torch_npu``, ``numpy``, ``pillow`` and
        ``helpers``; a value is None when the package is not installed. The
        helpers version comes from the installed project distribution, else
        from ``helpers.__version__``.
    """
    out: dict[str, str | None] = {"python": platform.python_version()}
    for key, dist in _VERSION_DISTS.items():
        try:
            out[key] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[key] = None
    try:
        out["helpers"] = importlib.metadata.version(_PROJECT_DIST)
    except importlib.metadata.PackageNotFoundError:
        out["helpers"] = getattr(helpers, "__version__", None)
    return out


# --------------------------------------------------------------------------- JSON helpers


def _jsonable(value: Any, where: str) -> Any:
    """Return ``value`` converted to plain JSON types, or raise ParameterError.

    numpy scalars and arrays become Python numbers and lists, paths become
    strings, tuples and sets become lists; NaN and infinity are refused.
    """
    if value is None or isinstance(value, (str, bool)):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        f = float(value)
        if not math.isfinite(f):
            raise ParameterError(
                f"{where}: {f!r} is not a finite number; only finite numbers or None can be "
                f"stored - record None and say why in 'reason' or 'extra'"
            )
        return f
    if isinstance(value, PurePath):
        return str(value)
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v, f"{where}[{k!r}]") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, (set, frozenset)):
        return [_jsonable(v, f"{where}[]") for v in sorted(value, key=repr)]
    tolist = getattr(value, "tolist", None)  # numpy arrays and scalars (np.bool_, ...)
    if callable(tolist):
        return _jsonable(tolist(), where)
    raise ParameterError(
        f"{where}: cannot store a {type(value).__name__} ({value!r:.80}); convert it to a "
        f"number, string, list or dict first"
    )


def _check_text(name: str, value: Any, *, allow_empty: bool = False) -> str:
    if not isinstance(value, str) or (not allow_empty and not value.strip()):
        raise ParameterError(
            f"Record.{name}: expected a {'str' if allow_empty else 'non-empty str'}, "
            f"got {value!r} ({type(value).__name__})"
        )
    return value


# --------------------------------------------------------------------------- Record


@dataclass(frozen=True)
class Record:
    """One measured or derived number, with everything needed to trust it later.

    Parameters
    ----------
    notebook : str
        Notebook that produced it, e.g. ``"04_pinned_memory"``.
    experiment : str
        What was measured, e.g. ``"h2d_bandwidth"``; ``"verdict"`` for verdicts.
    variant : str
        Which variant, e.g. ``"pinned"``, ``"B vs A"``.
    metric : str
        Name of the quantity, e.g. ``"time"``, ``"throughput"``, ``"speedup"``.
    value : float or None
        The number, finite; None when there is no number (e.g. not applicable).
    unit : str
        Unit of ``value`` (``"s"``, ``"items/s"``, ``"GB/s"``, ``"x"``; may be
        ``""`` for a dimensionless count).
    repeats : int or None
        Repeats behind ``value`` (>= 1).
    spread : dict or None
        Spread of ``value`` in the same unit, e.g. ``{"p25", "p75", "min",
        "max"}`` or ``{"ci_low", "ci_high", "confidence"}``; finite numbers.
    device : str or None
        Device the number was measured on, e.g. ``"cuda:0 (NVIDIA H200)"``.
    parameters : dict
        The notebook's parameters.
    versions : dict
        Library versions (see :func:`versions`).
    timestamp : str
        ISO-8601 UTC time of the record; set on creation.
    recommendation : str or None
        One of :data:`RECOMMENDATIONS`; needs a ``reason``.
    reason : str or None
        Why, in one sentence, for the reader.
    extra : dict
        Anything else (raw times, sizes, names); JSON-serializable.

    Raises
    ------
    ParameterError
        If a text field is empty, ``value`` or a spread entry is NaN or
        infinite or not a number, ``repeats`` < 1, ``recommendation`` is not in
        :data:`RECOMMENDATIONS` or lacks a reason, or a dict holds something
        that JSON cannot store.
    """

    notebook: str
    experiment: str
    variant: str
    metric: str
    value: float | None
    unit: str
    repeats: int | None = None
    spread: dict | None = None
    device: str | None = None
    parameters: dict = field(default_factory=dict)
    versions: dict = field(default_factory=dict)
    timestamp: str = field(default_factory=_utc_now)
    recommendation: str | None = None
    reason: str | None = None
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("notebook", "experiment", "variant", "metric"):
            _check_text(name, getattr(self, name))
        _check_text("unit", self.unit, allow_empty=True)
        _check_text("timestamp", self.timestamp)
        set_ = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731 - frozen dataclass

        value = self.value
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise ParameterError(
                    f"Record.value for {self.experiment}/{self.variant}/{self.metric}: expected a "
                    f"number or None, got {value!r} ({type(value).__name__})"
                )
            value = float(value)
            if not math.isfinite(value):
                raise ParameterError(
                    f"Record.value for {self.experiment}/{self.variant}/{self.metric}: {value!r} "
                    f"is not finite; NaN and infinity never enter the store - find why the "
                    f"measurement failed, or record None with a reason"
                )
            set_("value", value)

        if self.repeats is not None:
            if isinstance(self.repeats, bool) or not isinstance(self.repeats, numbers.Integral) \
                    or self.repeats < 1:
                raise ParameterError(
                    f"Record.repeats: expected an int >= 1 or None, got {self.repeats!r} "
                    f"({type(self.repeats).__name__})"
                )
            set_("repeats", int(self.repeats))

        if self.spread is not None:
            if not isinstance(self.spread, Mapping):
                raise ParameterError(
                    f"Record.spread: expected a dict of numbers or None, got {self.spread!r}"
                )
            spread = {}
            for k, v in self.spread.items():
                if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v):
                    raise ParameterError(
                        f"Record.spread[{k!r}]: expected a finite number, got {v!r} "
                        f"({type(v).__name__})"
                    )
                spread[str(k)] = float(v)
            set_("spread", spread)

        if self.device is not None:
            _check_text("device", self.device)

        if self.recommendation is not None:
            if self.recommendation not in RECOMMENDATIONS:
                raise ParameterError(
                    f"Record.recommendation: {self.recommendation!r} is not one of "
                    f"{', '.join(repr(r) for r in RECOMMENDATIONS)}"
                )
            if not isinstance(self.reason, str) or not self.reason.strip():
                raise ParameterError(
                    f"Record.reason: a recommendation ({self.recommendation!r}) needs a non-empty "
                    f"reason, got {self.reason!r}; say in one sentence why"
                )
        if self.reason is not None:
            _check_text("reason", self.reason)

        for name in ("parameters", "versions", "extra"):
            d = getattr(self, name)
            if not isinstance(d, Mapping):
                raise ParameterError(
                    f"Record.{name}: expected a dict, got {d!r} ({type(d).__name__})"
                )
            set_(name, _jsonable(dict(d), f"Record.{name}"))

    def to_dict(self) -> dict[str, Any]:
        """Return the record as a dict of plain JSON types, in field order."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def to_json(self) -> str:
        """Return the record as one line of JSON (no newline inside or at the end)."""
        return json.dumps(self.to_dict(), ensure_ascii=False, allow_nan=False)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Record:
        """Build a record from a dict such as one line of a results file.

        Keys that are not Record fields are kept in ``extra``.

        Raises
        ------
        ParameterError
            If a required field is missing or a value is invalid.
        """
        names = {f.name for f in dataclasses.fields(cls)}
        known = {k: v for k, v in data.items() if k in names}
        unknown = {k: v for k, v in data.items() if k not in names}
        if unknown:
            known["extra"] = {**dict(known.get("extra") or {}), **unknown}
        missing = [n for n in ("notebook", "experiment", "variant", "metric", "value", "unit")
                   if n not in known]
        if missing:
            raise ParameterError(f"Record.from_dict: missing field(s) {', '.join(missing)}")
        for name in ("parameters", "versions", "extra"):
            if known.get(name) is None:
                known.pop(name, None)
        if known.get("timestamp") is None:
            known.pop("timestamp", None)
        return cls(**known)


#: Column order of every results DataFrame (the Record fields).
RECORD_COLUMNS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Record))


def _records_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """DataFrame with the Record columns first (object dtype for dict columns)."""
    import pandas as pd

    extra_cols = []
    for row in rows:
        for k in row:
            if k not in RECORD_COLUMNS and k not in extra_cols:
                extra_cols.append(k)
    columns = list(RECORD_COLUMNS) + extra_cols
    data = {c: pd.Series([row.get(c) for row in rows], dtype=object) for c in columns}
    df = pd.DataFrame(data, columns=columns)
    df["value"] = pd.to_numeric(df["value"], errors="coerce").astype("float64")
    # repeats stays object dtype (Python int or None): pandas' nullable Int64 would give
    # pd.NA, whose truth value raises in ordinary `if` tests
    df["repeats"] = pd.Series(
        [None if r is None or (isinstance(r, float) and math.isnan(r)) else int(r)
         for r in df["repeats"]],
        index=df.index, dtype=object,
    )
    return df


# --------------------------------------------------------------------------- store


class ResultsStore:
    """Append-only store of a notebook's records, in memory and in a JSON-lines file.

    Parameters
    ----------
    path : str, Path or None
        The results file (``.jsonl``). None or ``""``: keep records in memory
        only (nothing is written). The parent folder is created if needed;
        several notebooks may append to the same file.
    notebook : str
        Name of the notebook writing these records.
    device : str or None
        Device description stored in every record.
    parameters : dict or None
        The notebook's parameters, stored in every record.

    Raises
    ------
    OutputDirError
        If the folder cannot be created or the file cannot be opened for
        appending (checked once, here, before any work is done).
    ParameterError
        If ``notebook`` is empty or ``parameters`` cannot be stored as JSON.
    """

    def __init__(
        self,
        path: str | Path | None,
        *,
        notebook: str,
        device: str | None = None,
        parameters: Mapping[str, Any] | None = None,
    ) -> None:
        if not isinstance(notebook, str) or not notebook.strip():
            raise ParameterError(
                f"ResultsStore.notebook: expected a non-empty str, got {notebook!r}"
            )
        self.notebook = notebook
        self.device = device
        self.parameters: dict[str, Any] = _jsonable(dict(parameters or {}), "parameters")
        self._versions = versions()
        self._records: list[Record] = []
        self._path: Path | None = None
        if path is None or (isinstance(path, str) and not path.strip()):
            return
        p = Path(path).expanduser()
        try:
            p.parent.mkdir(parents=True, exist_ok=True)
            with open(p, "ab"):
                pass
        except OSError as exc:
            raise OutputDirError(
                f"results file {str(p)!r} cannot be written ({type(exc).__name__}: {exc}); "
                f"choose a writable path for the results, or pass None to keep them in memory"
            ) from exc
        self._path = p

    @property
    def path(self) -> Path | None:
        """The results file, or None for an in-memory store."""
        return self._path

    @property
    def records(self) -> tuple[Record, ...]:
        """The records added through this store, in order."""
        return tuple(self._records)

    def versions(self) -> dict[str, str | None]:
        """The versions captured when the store was made (a copy)."""
        return dict(self._versions)

    def __repr__(self) -> str:
        where = str(self._path) if self._path else "memory"
        return f"ResultsStore({where!r}, notebook={self.notebook!r}, records={len(self._records)})"

    # -- writing ---------------------------------------------------------------------

    def _append(self, record: Record) -> Record:
        line = record.to_json().encode("utf-8") + b"\n"
        if self._path is not None:
            try:
                with open(self._path, "ab+") as f:
                    f.seek(0, os.SEEK_END)
                    if f.tell() > 0:
                        f.seek(-1, os.SEEK_END)
                        if f.read(1) != b"\n":
                            # an earlier run was cut off mid-line: end that line so this
                            # record stays readable
                            line = b"\n" + line
                    f.seek(0, os.SEEK_END)
                    f.write(line)
                    f.flush()
                    os.fsync(f.fileno())
            except OSError as exc:
                raise OutputDirError(
                    f"could not append to results file {str(self._path)!r} "
                    f"({type(exc).__name__}: {exc}); check free space and permissions"
                ) from exc
        self._records.append(record)
        logger.debug("recorded %s", line.strip())
        return record

    def _make(self, **fields: Any) -> Record:
        return Record(
            notebook=self.notebook,
            device=self.device,
            parameters=self.parameters,
            versions=self._versions,
            **fields,
        )

    def add(
        self,
        experiment: str,
        variant: str,
        metric: str,
        value: float | None,
        unit: str,
        *,
        repeats: int | None = None,
        spread: Mapping[str, float] | None = None,
        recommendation: str | None = None,
        reason: str | None = None,
        **extra: Any,
    ) -> Record:
        """Append one record and, for a file store, write it durably.

        The line is written, flushed and ``os.fsync``-ed before returning, so
        an interrupted run keeps every record that was added.

        Parameters
        ----------
        experiment, variant, metric : str
            See :class:`Record`.
        value : float or None
            Finite number or None.
        unit : str
            Unit of ``value``.
        repeats : int or None
            Repeats behind the value.
        spread : dict or None
            Spread of the value, same unit.
        recommendation, reason : str or None
            Optional verdict for this row (e.g. ``"not applicable"`` with the
            reason); see :meth:`verdict` for the notebook's overall verdict.
        **extra
            Stored in ``Record.extra``.

        Returns
        -------
        Record

        Raises
        ------
        ParameterError
            If the record is invalid (see :class:`Record`).
        OutputDirError
            If the file cannot be appended to.
        """
        return self._append(
            self._make(
                experiment=experiment, variant=variant, metric=metric, value=value, unit=unit,
                repeats=repeats, spread=None if spread is None else dict(spread),
                recommendation=recommendation, reason=reason, extra=extra,
            )
        )

    def add_measurement(
        self,
        experiment: str,
        variant: str,
        m: Measurement,
        *,
        metric: str = "time",
        unit: str = "s",
        rate_metric: str | None = None,
        rate_unit: str | None = None,
        **extra: Any,
    ) -> list[Record]:
        """Append the median time of a Measurement, and its rate when it has one.

        Parameters
        ----------
        experiment, variant : str
            See :class:`Record`.
        m : helpers.timing.Measurement
            The measurement; its median (seconds) becomes the value, its
            ``p25``, ``p75``, ``min`` and ``max`` the spread, and its raw times,
            warm-up count and name go into ``extra``.
        metric, unit : str
            Metric name and unit of the time record (default ``"time"``, ``"s"``).
        rate_metric, rate_unit : str or None
            Metric and unit of the rate record written when
            ``m.items_per_call`` is set (defaults ``"throughput"`` and
            ``"items/s"``); its spread is the rate at each time quantile.
        **extra
            Stored in ``extra`` of every record written.

        Returns
        -------
        list of Record
            The time record, then the rate record if any.

        Raises
        ------
        ParameterError
            If ``m`` is not a Measurement, or a rate metric is asked for while
            ``m.items_per_call`` is None.
        """

        if not isinstance(m, Measurement):
            raise ParameterError(
                f"add_measurement: expected a helpers.timing.Measurement, got {type(m).__name__}"
            )
        if (rate_metric is not None or rate_unit is not None) and m.items_per_call is None:
            raise ParameterError(
                f"add_measurement({experiment!r}, {variant!r}): rate_metric/rate_unit given but the "
                f"measurement has no items_per_call; pass items_per_call to measure()"
            )
        common = {"measurement": m.name, "warmup": m.warmup, **extra}
        out = [
            self.add(
                experiment, variant, metric, m.median_s, unit, repeats=m.repeats,
                spread={"p25": m.p25_s, "p75": m.p75_s, "min": m.min_s, "max": m.max_s},
                times_s=list(m.times_s), **common,
            )
        ]
        if m.items_per_call is not None and m.rate is not None:
            items = m.items_per_call
            rate_spread = {
                "p25": m.rate_p25, "p75": m.rate_p75, "min": items / m.max_s,
                "max": items / m.min_s if m.min_s > 0 else None,
            }
            # a 0 s time (coarse clock) has no finite rate: leave that entry out
            rate_spread = {k: v for k, v in rate_spread.items() if v is not None}
            out.append(
                self.add(
                    experiment, variant, rate_metric or "throughput", m.rate, rate_unit or "items/s",
                    repeats=m.repeats, spread=rate_spread, items_per_call=items, **common,
                )
            )
        elif m.items_per_call is not None:
            logger.warning(
                "%s/%s: no rate recorded, the median time is 0 s (clock too coarse)",
                experiment, variant,
            )
        return out

    def add_comparison(
        self,
        experiment: str,
        c: Comparison,
        *,
        metric: str = "speedup",
        unit: str = "x",
        **extra: Any,
    ) -> Record:
        """Append the speedup of B over A from a Comparison.

        The value is ``c.ratio`` (median A / median B; > 1: B is faster), the
        spread ``{"ci_low", "ci_high", "confidence"}``, the variant
        ``"<b name> vs <a name>"``, and ``extra`` holds both medians (seconds),
        the verdict sentence and ``**extra``.

        Raises
        ------
        ParameterError
            If ``c`` is not a Comparison or its interval is not finite.
        """

        if not isinstance(c, Comparison):
            raise ParameterError(
                f"add_comparison: expected a helpers.timing.Comparison, got {type(c).__name__}"
            )
        a_name, b_name = c.a.name or "A", c.b.name or "B"
        return self.add(
            experiment, f"{b_name} vs {a_name}", metric, c.ratio, unit,
            repeats=min(c.a.repeats, c.b.repeats),
            spread={"ci_low": c.ci_low, "ci_high": c.ci_high, "confidence": c.confidence},
            a=a_name, b=b_name, a_median_s=c.a.median_s, b_median_s=c.b.median_s,
            verdict_text=c.verdict_text(), **extra,
        )

    def verdict(
        self,
        *,
        metric: str,
        value: float | None,
        unit: str,
        recommendation: str,
        reason: str,
        repeats: int | None = None,
        spread: Mapping[str, float] | None = None,
        action: Action | None = None,
        **extra: Any,
    ) -> Record:
        """Append the notebook's verdict (experiment and variant ``"verdict"``).

        Parameters
        ----------
        metric, value, unit
            The number the verdict rests on (e.g. ``"speedup"``, 2.4, ``"x"``);
            value may be None (e.g. not applicable).
        recommendation : str
            One of :data:`RECOMMENDATIONS`.
        reason : str
            Non-empty sentence for the reader, e.g. "pinned copies were 2.4x
            faster on this machine".
        repeats, spread
            Repeats and spread of ``value``, as in :meth:`add` (e.g. the
            interval of a speedup: ``{"ci_low", "ci_high", "confidence"}``).
        action : helpers.verdict.Action, optional
            The setting decided and its value, stored as ``extra["action"]``
            (the report and notebook 10 read it; nothing parses ``reason``).
        **extra
            Stored in ``extra``.

        Raises
        ------
        ParameterError
            If ``recommendation`` is not in :data:`RECOMMENDATIONS` or ``reason`` is empty.
        """
        if action is not None:
            if not isinstance(action, Action):
                raise ParameterError(f"verdict: action must be a helpers.verdict.Action, got {action!r}")
            extra["action"] = action.to_dict()
        if recommendation not in RECOMMENDATIONS:
            raise ParameterError(
                f"verdict: recommendation {recommendation!r} is not one of "
                f"{', '.join(repr(r) for r in RECOMMENDATIONS)}"
            )
        if not isinstance(reason, str) or not reason.strip():
            raise ParameterError(
                f"verdict: reason must be a non-empty sentence saying why, got {reason!r}"
            )
        return self.add("verdict", "verdict", metric, value, unit, repeats=repeats, spread=spread,
                        recommendation=recommendation, reason=reason, **extra)

    def write(self, records: "Records") -> list[Record]:
        """Append every record of ``records``, in the order they were described.

        This is how an experiment's result reaches the store: the experiment describes its records with
        :class:`Records` (the same calls as this store's, without a store), and the notebook's
        ``ctx.record(result)`` writes them here.

        Returns
        -------
        list of Record
            The records appended.

        Raises
        ------
        ParameterError
            If ``records`` is not a :class:`Records`, or as the call it replays.
        """
        if not isinstance(records, Records):
            raise ParameterError(f"write: expected a helpers.results.Records, got {type(records).__name__}")
        out: list[Record] = []
        for name, args, kwargs in records.calls:
            made = getattr(self, name)(*args, **kwargs)
            out.extend(made if isinstance(made, list) else [made])
        return out

    def add_verdict(self, verdict: Verdict) -> Record:
        """Append a :class:`helpers.verdict.Verdict` (see :meth:`verdict`).

        Raises
        ------
        ParameterError
            If the verdict belongs to another notebook than this store's.
        """
        if verdict.notebook != self.notebook:
            raise ParameterError(f"add_verdict: the verdict is {verdict.notebook!r}'s, this store records "
                                 f"{self.notebook!r}")
        return self.verdict(**verdict.store_fields())

    # -- reading ---------------------------------------------------------------------

    def frame(self) -> pd.DataFrame:
        """Return this store's records as a DataFrame (columns as :func:`load_results`)."""
        return _records_frame([r.to_dict() for r in self._records])


# --------------------------------------------------------------------------- reading


def load_results(path: str | Path) -> pd.DataFrame:
    """Read a JSON-lines results file into a DataFrame.

    Parameters
    ----------
    path : str or Path
        The results file.

    Returns
    -------
    pandas.DataFrame
        One row per readable record, in file order. Columns: the Record
        fields (:data:`RECORD_COLUMNS`) in order, then any unknown keys. ``value``
        is float64 (NaN where None), ``repeats`` holds Python ints or None, ``spread``,
        ``parameters``, ``versions`` and ``extra`` hold dicts (or None). A
        missing file gives an empty frame with the Record columns. Blank
        lines are ignored; a line that is not valid JSON (such as one cut off
        by an interrupted write), not an object, or not a valid :class:`Record`
        (a missing field, a NaN written by another tool) is skipped with a
        logged warning naming its line number.

    Raises
    ------
    DataError
        If ``path`` is a folder or cannot be read.
    """
    p = Path(path).expanduser()
    rows: list[dict[str, Any]] = []
    if not p.exists():
        logger.info("no results file at %s; returning an empty table", p)
        return _records_frame(rows)
    try:
        with open(p, "rb") as f:
            raw_lines = f.read().split(b"\n")
    except OSError as exc:
        raise DataError(
            f"cannot read results file {str(p)!r} ({type(exc).__name__}: {exc}); "
            f"pass the path of a .jsonl file"
        ) from exc
    for lineno, raw in enumerate(raw_lines, start=1):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            logger.warning("%s line %d: skipped, not valid JSON (%s); an interrupted write?",
                           p, lineno, exc)
            continue
        if not isinstance(obj, dict):
            logger.warning("%s line %d: skipped, not a JSON object", p, lineno)
            continue
        try:
            Record.from_dict(obj)
        except (ParameterError, TypeError) as exc:
            logger.warning("%s line %d: skipped, not a valid record (%s)", p, lineno, exc)
            continue
        rows.append(obj)
    return _records_frame(rows)


def verdicts(df: pd.DataFrame) -> pd.DataFrame:
    """Return the latest verdict of each notebook.

    Parameters
    ----------
    df : pandas.DataFrame
        Results as returned by :func:`load_results` or :meth:`ResultsStore.frame`.

    Returns
    -------
    pandas.DataFrame
        Rows with ``experiment == "verdict"``, the last one (in file order)
        per notebook, in order of first appearance of the notebook; index reset.

    Raises
    ------
    DataError
        If ``df`` lacks the ``experiment`` or ``notebook`` column.
    """
    missing = [c for c in ("experiment", "notebook") if c not in df.columns]
    if missing:
        raise DataError(
            f"verdicts: the table has no column(s) {', '.join(missing)}; pass the frame "
            f"returned by load_results()"
        )
    v = df[df["experiment"] == "verdict"]
    v = v.drop_duplicates(subset="notebook", keep="last")
    order = {nb: i for i, nb in enumerate(dict.fromkeys(df["notebook"]))}
    v = v.assign(_order=v["notebook"].map(order)).sort_values("_order", kind="stable")
    return v.drop(columns="_order").reset_index(drop=True)


class Records:
    """The records an experiment's result describes, kept until a store writes them (:meth:`ResultsStore.write`).

    It has the store's own writing calls, with the same parameters and checks deferred to the write:
    :meth:`add`, :meth:`add_measurement` and :meth:`add_comparison` (see :class:`ResultsStore`). An experiment
    never holds a store; it returns a result whose ``records()`` builds one of these, so that every record and
    verdict of a notebook goes through one call (``ctx.record(result)``, :mod:`helpers.workbook.nbsetup`), which
    also applies the busy-machine check. Verdicts are not described here: a result returns its verdict separately.

    Examples
    --------
    >>> r = Records()
    >>> r.add("pinned copy", "pinned", "bandwidth", 12.5, "GB/s", repeats=20)
    >>> len(r)
    1
    """

    _CALLS = ("add", "add_measurement", "add_comparison")

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple, dict]] = []

    def __len__(self) -> int:
        return len(self.calls)

    def __repr__(self) -> str:
        return f"Records({len(self.calls)} record call(s))"

    def extend(self, other: "Records") -> "Records":
        """Append ``other``'s calls after these; returns self."""
        self.calls.extend(other.calls)
        return self

    def add(self, experiment: str, variant: str, metric: str, value: float | None, unit: str,
            **kwargs: Any) -> None:
        """Describe one record, as :meth:`ResultsStore.add`."""
        self.calls.append(("add", (experiment, variant, metric, value, unit), kwargs))

    def add_measurement(self, experiment: str, variant: str, m: Measurement, **kwargs: Any) -> None:
        """Describe a Measurement's records, as :meth:`ResultsStore.add_measurement`."""
        self.calls.append(("add_measurement", (experiment, variant, m), kwargs))

    def add_comparison(self, experiment: str, c: Comparison, **kwargs: Any) -> None:
        """Describe a Comparison's record, as :meth:`ResultsStore.add_comparison`."""
        self.calls.append(("add_comparison", (experiment, c), kwargs))
