"""Like with like: what each variant of an A/B ran with, recorded beside its figures, and the check that the two
sides of a comparison differ only in the change they measure.

A gain is credited to a change only when nothing else moved between the two sides (DESIGN.md, "Measurement
rules"). Two settings move silently on a CPU: torch's intra-op thread count (a variant that calls
``torch.set_num_threads`` runs its step on fewer or more cores; on a busy 2-core machine one thread can beat two
several times over, because two oversubscribe the cores) and the batch size (a larger batch changes the time per
step and the rate). So every variant says what it ran with while it runs (:func:`ran_with`), every comparison record
carries both sides' (:func:`sides`), and :func:`unlike` / :func:`unlike_records` find the comparisons whose sides
differ in a setting that is not the change they measure.

Imports no torch at module level (the command line reads this module); :func:`ran_with` imports it when it reads the
thread count.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from helpers.errors import ParameterError

__all__ = ["CONDITIONS", "held", "ran_with", "sides", "unlike", "unlike_records"]

#: The settings every variant of a comparison states and, unless one is the change itself, shares with the other
#: side: torch's intra-op threads (count) and the batch size (samples per step or per timed call).
CONDITIONS: tuple[str, ...] = ("torch_threads", "batch_size")


def ran_with(batch_size: int | None, *, torch_threads: int | None = None) -> dict[str, int | None]:
    """What a variant runs with, read while it runs (call it inside the variant's measurement, not when writing
    its records: a variant that sets its own thread count restores the previous one when it ends).

    Parameters
    ----------
    batch_size : int or None
        Samples per step (or per timed call) of the variant; None where the variant has no batch.
    torch_threads : int, optional
        Torch intra-op threads (count); default ``torch.get_num_threads()`` now.

    Returns
    -------
    dict
        ``{"torch_threads": int, "batch_size": int or None}``, the keys of :data:`CONDITIONS`.
    """
    if torch_threads is None:
        import torch

        torch_threads = torch.get_num_threads()
    return {"torch_threads": int(torch_threads), "batch_size": None if batch_size is None else int(batch_size)}


def held(start: Mapping[str, Any]) -> dict[str, Any]:
    """What held throughout a measurement: :func:`ran_with` read at its start, read again at its end.

    For an experiment whose variants all run in one stretch of code that sets no thread count (interleaved
    comparisons in one process): one reading before and one after stand for every variant measured in between.

    Parameters
    ----------
    start : mapping
        :func:`ran_with` read when the measurement started.

    Returns
    -------
    dict
        ``start``, less any setting that changed in between (something the measurement ran set torch's threads):
        a record built from it then does not claim that setting, which :func:`unlike` reports.
    """
    now = ran_with(start.get("batch_size"))
    return {k: v for k, v in start.items() if now.get(k) == v}


def sides(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None, *,
          changes: Iterable[str] = ()) -> dict[str, Any]:
    """The ``extra`` of a comparison record: what each side ran with, and which setting the comparison changes on
    purpose.

    Parameters
    ----------
    a, b : mapping or None
        :func:`ran_with` of side A (the baseline) and side B (the candidate). A side that does not say (None, or a
        key missing) leaves its keys out, which :func:`unlike` reports.
    changes : iterable of str
        The settings of :data:`CONDITIONS` that are the change itself (the batch of a batch-size search, the thread
        count of a thread count's own effect); empty for a comparison of anything else.

    Returns
    -------
    dict
        ``a_torch_threads``, ``a_batch_size``, ``b_torch_threads``, ``b_batch_size`` (threads: count; batch:
        samples; None: the side has no batch) where stated, and ``changes`` (a sorted list).

    Raises
    ------
    ParameterError
        A change that is not one of :data:`CONDITIONS`.
    """
    changes = sorted(set(changes))
    bad = [c for c in changes if c not in CONDITIONS]
    if bad:
        raise ParameterError(f"changes {bad!r}: a comparison can only change {', '.join(CONDITIONS)} on purpose")
    out = {f"{name}_{k}": side[k] for name, side in (("a", a), ("b", b)) if side is not None
           for k in CONDITIONS if k in side}
    out["changes"] = changes
    return out


def unlike(extra: Mapping[str, Any]) -> list[str]:
    """Why one comparison is not like with like, read from its record's ``extra`` (:func:`sides`).

    Parameters
    ----------
    extra : mapping
        The ``extra`` of a comparison record (or a verdict's) with :func:`sides`' keys.

    Returns
    -------
    list of str
        One sentence per setting of :data:`CONDITIONS` that a side does not state, or that differs between the
        sides while it is not in ``changes``; empty when the sides ran alike.
    """
    changes = set(extra.get("changes") or ())
    out = []
    for k in CONDITIONS:
        a, b = f"a_{k}", f"b_{k}"
        if a not in extra or b not in extra:
            out.append(f"does not say the {k} each side ran with")
        elif extra[a] != extra[b] and k not in changes:
            out.append(f"its sides ran with different {k}: {extra[a]} (A) and {extra[b]} (B), and {k} is not the "
                       "change it measures")
    return out


def _is_comparison(extra: Mapping[str, Any]) -> bool:
    """A record of :meth:`helpers.results.ResultsStore.add_comparison` (both medians), or one stating its sides."""
    return ("a_median_s" in extra and "b_median_s" in extra) or any(f"a_{k}" in extra for k in CONDITIONS)


def unlike_records(records: Iterable[Any]) -> list[str]:
    """Every comparison of a results file whose sides did not run alike (:func:`unlike`).

    Parameters
    ----------
    records : iterable of mapping or of helpers.results.Record
        Records (``notebook``, ``experiment``, ``variant``, ``extra``) as dicts, e.g. the rows of
        :func:`helpers.results.load_results` (``df.to_dict("records")``), or as the store writes them. A comparison
        is a record written by ``add_comparison`` (its ``extra`` holds both medians) or one that states its sides
        (:func:`sides`); the others are skipped.

    Returns
    -------
    list of str
        ``"<notebook> / <experiment> / <variant>: <why>"`` per problem; empty when every comparison ran like with
        like.
    """
    out = []
    for r in records:
        get = r.get if isinstance(r, Mapping) else (lambda k, r=r: getattr(r, k, None))
        extra = get("extra")
        if not isinstance(extra, Mapping) or not _is_comparison(extra):
            continue
        where = f"{get('notebook')} / {get('experiment')} / {get('variant')}"
        out.extend(f"{where}: {why}" for why in unlike(extra))
    return out
