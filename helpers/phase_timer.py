"""Per-step phase timing for a training loop (:class:`PhaseTimer`): each phase (data, h2d, compute, ...) bracketed
by device synchronizes, so device work queued inside a phase is charged to it.

The conventions are in :mod:`helpers.timing`, which re-exports :class:`PhaseTimer`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from helpers.errors import ParameterError
from helpers.measurement import _check_callable, _check_int

if TYPE_CHECKING:  # pragma: no cover - only for type checkers
    import pandas as pd

__all__ = ["PhaseTimer"]


@dataclass(frozen=True)
class _PhaseRow:
    step: int
    phase: str
    start: float
    duration_s: float


class PhaseTimer:
    """Per-step phase timing for a training loop (data, h2d, forward, backward, ...).

    Use::

        timer = PhaseTimer(sync=device_sync)
        for batch in loader_iter:
            with timer.phase("h2d"):
                ...
            with timer.phase("compute"):
                ...
            timer.end_step()
        timer.totals(skip_steps=2)

    Each phase is bracketed by ``sync()`` before its start and before its
    stop, so device work queued inside the phase is charged to it and not to
    the next one. Phases may not be nested (their times would be counted
    twice in a step's total).

    Parameters
    ----------
    sync : callable or None
        Device synchronization (None on a CPU).
    clock : callable, default time.perf_counter
        Returns seconds; replaceable for tests.
    """

    def __init__(
        self,
        sync: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        _check_callable("sync", sync, optional=True)
        _check_callable("clock", clock)
        self.sync = sync
        self.clock = clock
        self._rows: list[_PhaseRow] = []
        self._step = 0
        self._origin: float | None = None
        self._open: str | None = None

    def __repr__(self) -> str:
        return f"PhaseTimer(step={self._step}, rows={len(self._rows)})"

    @property
    def step(self) -> int:
        """Index of the step now being timed (0 for the first)."""
        return self._step

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time the enclosed block as phase ``name`` of the current step.

        Parameters
        ----------
        name : str
            Phase label (non-empty).

        Raises
        ------
        ParameterError
            If ``name`` is empty or not a str, or another phase is open.

        Notes
        -----
        If the block raises, the phase is recorded without the closing sync
        (which could raise again and hide the first error) and the exception
        propagates.
        """
        if not isinstance(name, str) or not name:
            raise ParameterError(f"phase name: expected a non-empty str, got {name!r}")
        if self._open is not None:
            raise ParameterError(
                f"phase {name!r} opened inside phase {self._open!r}; phases cannot be nested "
                f"(a step's total would count the time twice) - close the outer one first"
            )
        if self.sync is not None:
            self.sync()
        start = self.clock()
        if self._origin is None:
            self._origin = start
        self._open = name
        ok = False
        try:
            yield
            ok = True
        finally:
            if ok and self.sync is not None:
                self.sync()
            stop = self.clock()
            self._open = None
            self._rows.append(_PhaseRow(self._step, name, start, stop - start))

    def end_step(self) -> None:
        """Close the current step; later phases belong to the next one.

        Raises
        ------
        ParameterError
            If called while a phase is open.
        """
        if self._open is not None:
            raise ParameterError(
                f"end_step() called inside phase {self._open!r}; call it after the phase's block"
            )
        self._step += 1

    def reset(self) -> None:
        """Forget all rows and start again at step 0."""
        if self._open is not None:
            raise ParameterError(f"reset() called inside phase {self._open!r}")
        self._rows.clear()
        self._step = 0
        self._origin = None

    def frame(self) -> pd.DataFrame:
        """Return one row per phase per step.

        Returns
        -------
        pandas.DataFrame
            Columns ``step`` (int), ``phase`` (str), ``start_s`` (seconds since
            the start of the timer's first phase) and ``duration_s`` (seconds).
            A phase entered twice in a step gives two rows. Rows of the
            current (not yet ended) step are included.
        """
        import pandas as pd

        origin = self._origin if self._origin is not None else 0.0
        return pd.DataFrame(
            {
                "step": pd.Series([r.step for r in self._rows], dtype="int64"),
                "phase": pd.Series([r.phase for r in self._rows], dtype=object),
                "start_s": pd.Series([r.start - origin for r in self._rows], dtype="float64"),
                "duration_s": pd.Series([r.duration_s for r in self._rows], dtype="float64"),
            }
        )

    def totals(self, skip_steps: int = 0) -> pd.DataFrame:
        """Return the time of each phase per step.

        Parameters
        ----------
        skip_steps : int, default 0
            Leave out steps numbered below this (warm-up steps).

        Returns
        -------
        pandas.DataFrame
            One row per step that has at least one phase: ``step`` (int), one
            column per phase in first-seen order (seconds; a phase entered twice
            is summed; 0.0 where absent from that step), and ``step_s`` (the sum
            of the phases, seconds). Call :meth:`end_step` first so the last
            step is complete.

        Raises
        ------
        ParameterError
            If ``skip_steps`` is not an int >= 0.
        """
        import pandas as pd

        skip_steps = _check_int("skip_steps", skip_steps, 0)
        df = self.frame()
        phases = list(dict.fromkeys(df["phase"]))
        df = df[df["step"] >= skip_steps]
        if df.empty:
            out = pd.DataFrame({"step": pd.Series([], dtype="int64")})
            for p in phases:
                out[p] = pd.Series([], dtype="float64")
            out["step_s"] = pd.Series([], dtype="float64")
            return out
        wide = df.pivot_table(
            index="step", columns="phase", values="duration_s", aggfunc="sum", fill_value=0.0
        )
        wide = wide.reindex(columns=[p for p in phases if p in wide.columns]).fillna(0.0)
        for p in phases:
            if p not in wide.columns:
                wide[p] = 0.0
        wide = wide[phases].astype("float64")
        wide["step_s"] = wide.sum(axis=1)
        wide.columns.name = None
        out = wide.reset_index()
        out["step"] = out["step"].astype("int64")
        return out
