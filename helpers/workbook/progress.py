"""Progress for a notebook's long cells: a tqdm bar in JupyterLab, nothing headless.

A cell that trains for tens of seconds (notebook 01's baseline, 10's interleaved jobs) shows ``[*]`` and
nothing else otherwise. ``with progress_bar(total, "baseline steps") as bar: loop.run(n, progress=bar)`` draws
``tqdm.auto``'s bar (an ipywidgets bar in JupyterLab) that advances once per ``bar(done, total)`` call, so
one bar can span several ``run`` calls (warm-up, then measured steps). Headless (runner, papermill, nbval,
CI; :func:`helpers.params.headless`) the bar is a no-op, so executed notebooks and the runner's log stay
clean. The bar is updated between steps, outside their timing.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from helpers.live import Progress, no_progress
from helpers.params import headless


@contextmanager
def progress_bar(total: int, desc: str, *, unit: str = "step") -> Iterator[Progress]:
    """A progress callback ``bar(done, total)`` that advances a tqdm bar by one per call.

    Parameters
    ----------
    total : int
        Calls expected (e.g. warm-up + measured steps).
    desc : str
        The bar's label.
    unit : str
        What one call is (tqdm's ``unit``).

    Yields
    ------
    callable
        ``bar(done, total)``; the arguments are accepted for :data:`helpers.live.Progress` compatibility and
        ignored (each call is one unit). Headless: :func:`helpers.live.no_progress`.
    """
    if headless():
        yield no_progress
        return
    from tqdm.auto import tqdm

    bar = tqdm(total=int(total), desc=desc, unit=unit, leave=True)
    try:
        yield lambda done, _total: bar.update(1)
    finally:
        bar.close()
