"""Notebook 04's experiment: what pinned memory buys a host-to-device copy, and whether to enable it.

The copy methods themselves (``pageable``, ``pin_per_batch``,
``loader_pin_thread``, ``pinned_buffer``) are the mechanism of
:mod:`helpers.pipeline.transfer`; the link's limit and the host's cache are
machine facts of :mod:`helpers.diagnose.pcie`. Here they are timed side by
side and decided between:

- :func:`bandwidth_sweep`: each method's host-to-device bandwidth at each
  size of :func:`transfer_sizes`, and, as the ceiling the four are measured
  against, :data:`REFERENCE_METHOD` (``pinned_copy_only``): a non-blocking
  copy from memory pinned beforehand, timed with device events (the DMA's
  own rate);
- :func:`host_copy_sweep`: the host memcpy that pinning a batch costs at
  least (runs on any machine);
- :func:`bandwidth_summary`, :func:`memcpy_reference`,
  :func:`bandwidth_records`: the peak and main-memory rates, each named for
  what it is, as the notebook records them;
- :func:`batch_comparison`: one batch of the workload, each pinned method
  against pageable, interleaved;
- :func:`pinning_decision` / :func:`verdict`: enable the best pinned method,
  leave pinning off, or not applicable;
- :func:`run`: all of it in the notebook's order, as a :class:`PinningResult` that holds the tables and
  comparisons and makes the notebook's records, verdict and "try it" panel.

On a CPU nothing is copied to a device: every function reports "not
applicable" with the reason (:func:`helpers.pipeline.transfer.pinning_applicability`)
instead of raising, and only the host memcpy is measured.

Bandwidth is in GB/s = 1e9 bytes per second (:data:`helpers.diagnose.pcie.GB`, not GiB/s).

Where the parts live (imported here, where notebooks and tests find them): the timed copies
(:func:`transfer_sizes`, :func:`bandwidth_sweep`, :func:`host_copy_sweep`, :func:`batch_comparison`,
:func:`job_batch_comparison`, :func:`bandwidth_summary`, :func:`method_label`) in
:mod:`helpers.pipeline.transfer_bench`; what the result's cells print in :mod:`helpers.experiments.pinning_text`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd
import torch

from helpers import specs
from helpers.checklist import Item
from helpers.conditions import held, ran_with, sides
from helpers.diagnose.pcie import GB, LinkInfo
from helpers.errors import DataError, DeviceUnavailableError, ParameterError
from helpers.experiments.base import Experiment, ExperimentResult, Optimization
from helpers.experiments.pinning_text import PinningResultTexts, _kib_mib
from helpers.live import Knob, LivePoint, Progress, TrySpec, no_progress
from helpers.params import Param
from helpers.pipeline.transfer import METHODS, Applicability, batch_nbytes, pinning_applicability
from helpers.pipeline.transfer_bench import (
    _METHOD_LABELS,
    REFERENCE_METHOD,
    bandwidth_summary,
    bandwidth_sweep,
    batch_comparison,
    host_copy_sweep,
    job_batch_comparison,
    method_label,
    transfer_sizes,
)
from helpers.results import Records
from helpers.timing import Comparison
from helpers.units import format_bytes
from helpers.verdict import Action, Verdict
from helpers.workload import DEFAULT

if TYPE_CHECKING:  # pragma: no cover - typing only
    from helpers.device import Accelerator

logger = logging.getLogger(__name__)

__all__ = [
    "NOTEBOOK",
    "REFERENCE_METHOD",
    "transfer_sizes",
    "bandwidth_sweep",
    "host_copy_sweep",
    "batch_comparison",
    "job_batch_comparison",
    "bandwidth_summary",
    "memcpy_reference",
    "bandwidth_records",
    "pinning_decision",
    "verdict",
    "method_label",
    "TRY_METHODS",
    "live_point",
    "try_pinning",
    "PinningResult",
    "run",
]

#: The notebook whose experiment this is (the id its verdict is recorded under).
NOTEBOOK = "04_pinned_memory"


def _largest_label(size: int, regime: str, cache_bytes: int | None) -> str:
    if regime == "memory":
        return f"main-memory rate ({format_bytes(size)} copies; last-level cache {format_bytes(cache_bytes)})"
    if regime == "unknown":
        return f"rate at the largest size ({format_bytes(size)} copies; cache size unknown)"
    where = "in" if regime == "cache" else "partly in"
    return (f"rate at the largest size ({format_bytes(size)} copies, {where} the {format_bytes(cache_bytes)} cache: "
            "not main memory)")


def _advice(regime: str, cache_bytes: int | None) -> str:
    if regime in ("cache", "mixed") and cache_bytes:
        return f"set max_size_mib to {max(1, 2 * cache_bytes // 2**20)} or more for a main-memory rate"
    if regime == "unknown":
        return "the cache size is unknown, so whether this is a main-memory rate is not known"
    return ""


def memcpy_reference(summary: "pd.DataFrame", *, cache_bytes: int | None = None) -> dict[str, Any] | None:
    """The host memcpy figure to keep as the reference: its rate at the largest size.

    Pinning a batch costs one host memcpy per batch; a stream of batches does
    not stay in the cache, so the rate that matters is the main-memory one,
    not the cache-sized peak.

    Parameters
    ----------
    summary : pandas.DataFrame
        :func:`bandwidth_summary` (a ``host_memcpy`` row).
    cache_bytes : int, optional
        As given to :func:`bandwidth_summary` (for the label).

    Returns
    -------
    dict or None
        ``gbps``, ``gbps_p25``, ``gbps_p75``, ``size_bytes``, ``repeats``,
        ``regime``, ``label`` (what the number is, with the size and the
        cache), ``advice`` (how to get a main-memory rate when this is not
        one; empty when it is), ``peak_gbps``, ``peak_size_bytes``,
        ``peak_regime``; None without a host memcpy row.
    """
    rows = summary[summary["method"] == "host_memcpy"] if len(summary) else summary
    if not len(rows):
        return None
    r = rows.iloc[0]
    return {"gbps": float(r["largest_gbps"]), "gbps_p25": float(r["largest_gbps_p25"]),
            "gbps_p75": float(r["largest_gbps_p75"]), "size_bytes": int(r["largest_size_bytes"]),
            "repeats": int(r["largest_repeats"]), "regime": str(r["largest_regime"]),
            "label": _largest_label(int(r["largest_size_bytes"]), str(r["largest_regime"]), cache_bytes),
            "advice": _advice(str(r["largest_regime"]), cache_bytes),
            "peak_gbps": float(r["peak_gbps"]), "peak_size_bytes": int(r["peak_size_bytes"]),
            "peak_regime": str(r["peak_regime"])}


def bandwidth_records(summary: "pd.DataFrame", *, cache_bytes: int | None = None,
                      link_gbps: float | None = None) -> list[dict[str, Any]]:
    """The records notebook 04 stores for its bandwidth summary, each named for what it is.

    - ``host_memcpy``: experiment ``"host memcpy bandwidth"`` (it is not a
      host-to-device copy); first the reference, metric
      ``"memcpy_bandwidth"``, the rate at the largest size, labelled as a
      main-memory rate only when that size is beyond the last-level cache;
      then, when it is at another size, metric ``"memcpy_peak_bandwidth"``,
      the peak (labelled cache-sized when it fits in the cache).
    - every device method: experiment ``"h2d bandwidth"``, metrics
      ``"bandwidth_at_largest_size"`` and ``"peak_bandwidth"``, each with its
      size and, when the link's limit is known, its fraction of it.

    Parameters
    ----------
    summary : pandas.DataFrame
        :func:`bandwidth_summary`.
    cache_bytes : int, optional
    link_gbps : float, optional
        The link's limit (GB/s), or None/0 when unknown.

    Returns
    -------
    list of dict
        Keyword arguments for :meth:`helpers.results.ResultsStore.add`:
        ``experiment``, ``variant``, ``metric``, ``value``, ``unit``
        (``"GB/s"``), ``repeats``, ``spread`` (``p25``/``p75``) and extra
        fields (``size_bytes``, ``regime``, ``reference``, and for device
        methods ``fraction_of_link``).
    """
    out: list[dict[str, Any]] = []

    def record(experiment, variant, metric, row, which, **extra):
        return {"experiment": experiment, "variant": variant, "metric": metric, "value": float(row[f"{which}_gbps"]),
                "unit": "GB/s", "repeats": int(row[f"{which}_repeats"]),
                "spread": {"p25": float(row[f"{which}_gbps_p25"]), "p75": float(row[f"{which}_gbps_p75"])},
                "size_bytes": int(row[f"{which}_size_bytes"]), "regime": str(row[f"{which}_regime"]), **extra}

    for _, row in summary.iterrows():
        if row["method"] == "host_memcpy":
            ref = memcpy_reference(summary, cache_bytes=cache_bytes)
            out.append(record("host memcpy bandwidth", ref["label"], "memcpy_bandwidth", row, "largest",
                              reference=True))
            if int(row["peak_size_bytes"]) != int(row["largest_size_bytes"]):
                kind = "cache-sized peak" if row["peak_regime"] == "cache" else "peak"
                out.append(record("host memcpy bandwidth", f"{kind} ({format_bytes(row['peak_size_bytes'])} copies)",
                                  "memcpy_peak_bandwidth", row, "peak", reference=False))
            continue
        for which, metric in (("largest", "bandwidth_at_largest_size"), ("peak", "peak_bandwidth")):
            frac = float(row[f"{which}_gbps"]) / link_gbps if link_gbps else None
            out.append(record("h2d bandwidth", str(row["method"]), metric, row, which, fraction_of_link=frac))
    return out


def pinning_decision(comparisons: dict[str, "Comparison"], *, threshold: float = 1.05,
                    applicability: Applicability | None = None,
                    reference: dict[str, Any] | None = None) -> dict[str, Any]:
    """The notebook's verdict: enable the best pinned method, leave pinning off, or not applicable.

    Parameters
    ----------
    comparisons : dict
        From :func:`batch_comparison`.
    threshold : float, default 1.05
        Least lower bound of the speedup's confidence interval that counts as
        a real gain (5%: smaller gains are within run-to-run noise of copies).
    applicability : helpers.pipeline.transfer.Applicability, optional
        When given and not applicable, the verdict is "not applicable" with its reason.
    reference : dict, optional
        :func:`memcpy_reference`; when the verdict is "not applicable", its
        rate is quoted in the reason (what pinning a batch would cost at
        least), labelled for what it is.

    Returns
    -------
    dict
        ``recommendation`` ("enable", "leave off", "not applicable"),
        ``value`` (the best method's speedup, or None), ``method`` (its name
        or None), ``spread`` (its interval or None) and ``reason`` (a
        sentence built from the numbers), ``action`` (a :class:`helpers.verdict.Action` on
        ``pin_memory``).
    """
    v = _pinning_decision(comparisons, threshold=threshold, applicability=applicability, reference=reference)
    rec = v["recommendation"]
    v["action"] = Action("pin_memory", rec == "enable", f"pinned memory: {rec}", current=False)
    return v


def _pinning_decision(comparisons: dict[str, "Comparison"], *, threshold: float = 1.05,
                      applicability: Applicability | None = None,
                      reference: dict[str, Any] | None = None) -> dict[str, Any]:
    if applicability is not None and not applicability.applicable:
        reason = applicability.reason
        if reference is not None:
            reason += (f"; for reference, the host memcpy that pinning a batch would cost at least: "
                       f"{reference['gbps']:.1f} GB/s, {reference['label']}"
                       + (f" ({reference['advice']})" if reference["advice"] else ""))
            if reference["peak_size_bytes"] != reference["size_bytes"]:
                kind = "cache-sized peak" if reference["peak_regime"] == "cache" else "peak"
                reason += (f"; its {kind} is {reference['peak_gbps']:.1f} GB/s at "
                           f"{format_bytes(reference['peak_size_bytes'])}")
        return {"recommendation": "not applicable", "value": None, "method": None, "spread": None,
                "reason": reason}
    if not comparisons:
        return {"recommendation": "not applicable", "value": None, "method": None, "spread": None,
                "reason": "no pinned copy method was measured"}
    best_method, best = max(comparisons.items(), key=lambda kv: kv[1].ratio)
    spread = {"ci_low": best.ci_low, "ci_high": best.ci_high, "confidence": best.confidence}
    others = "; ".join(f"{k} {c.ratio:.2f}x" for k, c in comparisons.items() if k != best_method)
    pct = f"{best.confidence * 100:.0f}%"
    if best.ci_low > threshold:
        reason = (f"{_METHOD_LABELS[best_method]} copies a batch {best.ratio:.2f}x as fast as pageable "
                  f"({pct} CI {best.ci_low:.2f}-{best.ci_high:.2f}, above the {threshold:.2f}x threshold)"
                  + (f"; others: {others}" if others else ""))
        return {"recommendation": "enable", "value": best.ratio, "method": best_method, "spread": spread,
                "reason": reason}
    reason = (f"the best pinned method, {_METHOD_LABELS[best_method]}, reached {best.ratio:.2f}x pageable "
              f"({pct} CI {best.ci_low:.2f}-{best.ci_high:.2f}), not clearly above {threshold:.2f}x"
              + (f"; others: {others}" if others else ""))
    return {"recommendation": "leave off", "value": best.ratio, "method": best_method, "spread": spread,
            "reason": reason}


def verdict(comparisons: Mapping[str, Comparison], *, applicability: Applicability | None = None,
            reference: Mapping[str, Any] | None = None, link: LinkInfo | None = None,
            batch_gbps: Mapping[str, float] | None = None, context: str | None = None,
            threshold: float = 1.05) -> Verdict:
    """Notebook 04's verdict as a :class:`helpers.verdict.Verdict`, from the figures of :func:`pinning_decision`.

    Parameters
    ----------
    comparisons, applicability, reference, threshold
        As for :func:`pinning_decision`.
    link : helpers.diagnose.pcie.LinkInfo, optional
        The host-device link (:func:`helpers.diagnose.pcie.link_limit`). When
        its limit is known and a method was chosen, the reason adds that
        method's per-batch rate as a percentage of the limit.
    batch_gbps : mapping, optional
        ``{method: GB/s}``: the per-batch copy rate of each method (the
        batch's bytes over the median time of :func:`batch_comparison`'s
        measurements); needed for that percentage.
    context : str, optional
        What was measured, in one sentence (batch, sizes, repeats, device, link).

    Returns
    -------
    helpers.verdict.Verdict
        Notebook :data:`NOTEBOOK`, metric ``"speedup"`` in ``"x"``: the value,
        spread, recommendation and action of :func:`pinning_decision`, its
        reason (with the link sentence where it applies), ``context``, and in
        ``extra``: ``method`` (the best method, or None) and ``reference``
        (the host memcpy's reference figure: ``metric``
        ``"memcpy_bandwidth"``, ``value`` in ``unit`` ``"GB/s"``, ``what``;
        None without ``reference``).

    Raises
    ------
    ParameterError
        If the link's limit is known and ``batch_gbps`` lacks the chosen method's rate.
    """
    v = pinning_decision(comparisons, threshold=threshold, applicability=applicability, reference=reference)
    reason = v["reason"]
    if v["method"] is not None and link is not None and link.limit_gbps and batch_gbps is not None:
        if v["method"] not in batch_gbps:
            raise ParameterError(f"verdict: batch_gbps has no rate for {v['method']!r} (it has "
                                 f"{', '.join(batch_gbps) or 'none'}); pass the per-batch rate of every method compared")
        best_rate = batch_gbps[v["method"]]
        reason += (f"; that method reached {100 * best_rate / link.limit_gbps:.0f}% of the link ({link.label()}) "
                   "on one batch")
    ref = None if reference is None else {"metric": "memcpy_bandwidth", "value": reference["gbps"], "unit": "GB/s",
                                          "what": f"host memcpy, {reference['label']}"}
    return Verdict(NOTEBOOK, "speedup", v["value"], "x", v["recommendation"], reason, spread=v["spread"],
                   action=v["action"], context=context, extra={"method": v["method"], "reference": ref}
                   | ({"decision_threshold": float(threshold)} if v["spread"] else {}))


# --------------------------------------------------------------------------- try it

#: What :func:`try_pinning` can copy with: the four methods and the DMA-only reference, in that order.
TRY_METHODS: tuple[str, ...] = METHODS + (REFERENCE_METHOD,)
#: Largest transfer :func:`try_pinning` accepts, MiB: notebook 04's largest ``max_size_mib``.
MAX_TRY_SIZE_MIB = 1 << 16


def live_point(row: Mapping[str, Any], *, link_gbps: float | None = None) -> LivePoint:
    """One row of :func:`bandwidth_sweep` (a method at a size) as a "try it" point.

    Parameters
    ----------
    row : mapping
        ``method``, ``size_bytes``, ``gbps``, ``gbps_p25``, ``gbps_p75``, ``repeats`` (a row of the notebook's
        bandwidth table, or of :func:`try_pinning`'s own sweep).
    link_gbps : float, optional
        The link's limit, GB/s; when known the sentence gives the share of it.

    Returns
    -------
    LivePoint
        label ``"<size>, <method>"``, metric ``h2d_bandwidth``, unit ``GB/s`` (1e9 bytes/s); low/high: the rates
        at the 75th and 25th percentile copy times; ``extra``: ``method``, ``size_bytes``, ``repeats``,
        ``fraction_of_link`` (or None).

    Raises
    ------
    ParameterError
        For a row without a rate (a "not applicable" row of a CPU).
    """
    gbps = float(row["gbps"])
    if not math.isfinite(gbps):
        raise ParameterError(f"live_point: the row for {row.get('method')!r} has no rate ({row.get('reason', '')}); "
                             "take a row of a device where pinning applies")
    method, size = str(row["method"]), int(row["size_bytes"])
    label = f"{format_bytes(size)}, {method}"
    frac = gbps / link_gbps if link_gbps else None
    link = f", {frac:.0%} of the {link_gbps:g} GB/s link" if frac is not None else ""
    low, high = sorted((float(row["gbps_p25"]), float(row["gbps_p75"])))
    sentence = (f"{label}: {gbps:.2f} GB/s host to device (IQR {low:.2f}-{high:.2f}, {int(row['repeats'])} copies)"
                f"{link} - {method_label(method)}")
    return LivePoint(label=label, value=gbps, unit="GB/s", metric="h2d_bandwidth", low=low, high=high,
                     sentence=sentence, extra={"method": method, "size_bytes": size, "repeats": int(row["repeats"]),
                                               "fraction_of_link": frac})


def try_pinning(acc: "Accelerator", *, size_mib: float, method: str, repeats: int = 10, warmup: int = 2,
                seed: int = 0, link_gbps: float | None = None,
                progress: Progress = no_progress) -> LivePoint | Iterator[LivePoint]:
    """Notebook 04's host-to-device copy at one transfer size, pageable or pinned: GB/s.

    The copy is timed by :func:`bandwidth_sweep` at this one size, exactly as the notebook's sweep times each
    (method, size): ``warmup`` untimed copies, then ``repeats`` copies each bracketed by a device synchronize
    (:func:`helpers.timing.measure`), so pinning and staging are inside the time;
    :data:`REFERENCE_METHOD` is the DMA alone (source pinned beforehand, device events). The source is a flat
    uint8 tensor of random bytes of that size, whatever the job (a user's batch is copied whole in the
    notebook's section 4).

    Parameters
    ----------
    acc : helpers.device.Accelerator
        A device where pinning applies (CUDA, Ascend NPU).
    size_mib : float
        Bytes to copy, MiB (2**20 bytes; > 0, at most :data:`MAX_TRY_SIZE_MIB`); rounded to whole bytes.
    method : str
        One of :data:`TRY_METHODS` (``"pageable"``: plain ``.to(device)``; ``"pin_per_batch"``,
        ``"loader_pin_thread"``, ``"pinned_buffer"``: pinned ways; ``"pinned_copy_only"``: the DMA rate), or
        ``"all"``: each of them in turn, one point each (a sweep).
    repeats, warmup : int
        Timed (>= 1) and untimed (>= 0) copies.
    seed : int
        Seed of the host bytes.
    link_gbps : float, optional
        The link's limit (GB/s) for the share in the sentence; None or 0 when unknown.
    progress : callable
        ``progress(done, total)``: methods copied so far, of 1 (or of ``len(TRY_METHODS)`` for ``"all"``).

    Returns
    -------
    LivePoint or iterator of LivePoint
        metric ``h2d_bandwidth``, unit ``GB/s`` (:func:`live_point`); for ``"all"`` a generator yielding one
        point per method as each is measured.

    Raises
    ------
    helpers.errors.ParameterError
        For a size that is not a number in (0, MAX_TRY_SIZE_MIB] MiB, an unknown method (the message lists the
        choices), or ``repeats``/``warmup`` below their minimum. Raised when called, before any copy, for
        ``"all"`` too.
    helpers.errors.DeviceUnavailableError
        Where pinning does not apply (a CPU): there is no host-to-device transfer to time.
    """
    if isinstance(size_mib, bool) or not isinstance(size_mib, (int, float)) or not math.isfinite(size_mib) \
            or not 0 < size_mib <= MAX_TRY_SIZE_MIB:
        raise ParameterError(f"size_mib must be a number of MiB in (0, {MAX_TRY_SIZE_MIB}], got {size_mib!r}")
    nbytes = max(1, int(round(size_mib * 2**20)))
    if method != "all" and method not in TRY_METHODS:
        raise ParameterError(f"unknown copy method {method!r}; choose from {', '.join(TRY_METHODS)} or 'all'")
    for name, value, least in (("repeats", repeats, 1), ("warmup", warmup, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ParameterError(f"{name} must be an int >= {least}, got {value!r}")
    app = pinning_applicability(acc)
    if not app.applicable:
        raise DeviceUnavailableError(f"{app.reason}: a copy on the CPU is no host-to-device transfer; it applies on "
                                     "a CUDA GPU or an Ascend NPU")

    def one(m: str) -> LivePoint:
        table = bandwidth_sweep(acc, [nbytes], methods=[] if m == REFERENCE_METHOD else [m],
                                reference=m == REFERENCE_METHOD, repeats=repeats, warmup=warmup, seed=seed)
        return live_point(table.iloc[0], link_gbps=link_gbps)

    if method != "all":
        progress(0, 1)
        point = one(method)
        progress(1, 1)
        return point

    def each() -> Iterator[LivePoint]:
        for k, m in enumerate(TRY_METHODS):
            progress(k, len(TRY_METHODS))
            yield one(m)
        progress(len(TRY_METHODS), len(TRY_METHODS))

    return each()


# --------------------------------------------------------------------------- the notebook's run


@dataclass(frozen=True, eq=False)
class PinningResult(PinningResultTexts, ExperimentResult):
    """Notebook 04's measurement: the link, the copy methods' bandwidth per size and one batch per method.

    Attributes
    ----------
    device : str
        ``"<kind> (<name>)"`` of the accelerator, e.g. ``"cpu (cpu)"``.
    applicability : helpers.pipeline.transfer.Applicability
        Whether pinning applies here, and why (not on a CPU).
    refusal : str
        What torch said when asked to pin without an accelerator (``"RuntimeError: ..."``); empty where it did
        not raise or an accelerator is there.
    link : helpers.diagnose.pcie.LinkInfo
        The host-device link and its limit (GB/s, None when unknown).
    sizes : tuple of int
        The sweep's transfer sizes, bytes (:func:`transfer_sizes`).
    batch_shape : tuple of int or str
        The built-in batch's uint8 NHWC shape, or a user's batch described
        (:func:`helpers.jobs.check.describe_batch`).
    batch_bytes : int
        Bytes of that batch.
    job_name : str or None
        The user's job's name; None for the built-in batch.
    correct : dict
        ``{method: bit-exact}`` of :func:`helpers.pipeline.transfer.check_methods`; empty where pinning does not
        apply.
    table : pandas.DataFrame
        The bandwidth sweep's applicable rows and the host memcpy's (:func:`bandwidth_sweep`,
        :func:`host_copy_sweep`), with ``pct_of_link`` where the link's limit is known.
    cache_bytes : int or None
        The CPU's last-level cache, bytes.
    summary : pandas.DataFrame
        :func:`bandwidth_summary` of ``table``.
    reference : dict or None
        :func:`memcpy_reference`: the host memcpy's reference figure.
    comparisons : dict
        ``{method: Comparison}`` of one batch against pageable (:func:`batch_comparison`,
        :func:`job_batch_comparison`); empty where pinning does not apply.
    repeats, warmup : int
        Timed and untimed copies per size and method.
    ran : dict or None
        :func:`helpers.conditions.ran_with` over the per-batch comparisons (torch threads, the batch's samples):
        every method copied the same batch with them; None where not stated.
    """

    device: str
    applicability: Applicability
    refusal: str
    link: LinkInfo
    sizes: tuple[int, ...]
    batch_shape: Any
    batch_bytes: int
    job_name: str | None
    correct: Mapping[str, bool]
    table: pd.DataFrame
    cache_bytes: int | None
    summary: pd.DataFrame
    reference: Mapping[str, Any] | None
    comparisons: Mapping[str, Comparison]
    repeats: int
    warmup: int
    ran: Mapping[str, Any] | None = None

    # -- what the cells print ----------------------------------------------------------------

    def write_table(self, folder: "str | Path") -> str:
        """Section 3: write :attr:`table` to ``folder/bandwidth_sweep.csv`` (the folder is made) and say so, after
        why the device copies were skipped where they were (``folder``: the notebook's ``artifacts`` folder)."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        self.table.to_csv(folder / "bandwidth_sweep.csv", index=False)
        skipped = [] if self.applicability.applicable else [f"device copies skipped: {self.applicability.reason}"]
        return "\n".join(skipped + [f"{len(self.table)} rows written to {folder.parent.name}/{folder.name}/"
                                     "bandwidth_sweep.csv"])

    @property
    def batch_rows(self) -> pd.DataFrame:
        """Section 4: one batch's copy rate per method (pageable first): ``method``, ``label``, ``gbps``,
        ``gbps_p25``, ``gbps_p75`` (GB/s at the median, 75th and 25th percentile times); empty without a
        device."""
        rows = []
        for c in self.comparisons.values():
            for m in ((c.a,) if not rows else ()) + (c.b,):
                rows.append({"method": m.name, "label": method_label(m.name), "gbps": self.batch_bytes / m.median_s / GB,
                             "gbps_p25": self.batch_bytes / m.p75_s / GB, "gbps_p75": self.batch_bytes / m.p25_s / GB})
        return pd.DataFrame(rows, columns=["method", "label", "gbps", "gbps_p25", "gbps_p75"])

    # -- records, verdict and the panel ----------------------------------------------------------

    def records(self) -> Records:
        """The link, each method's round trip, the bandwidth summary (:func:`bandwidth_records`) and, per method,
        one batch's comparison, time and rate, with the torch threads and batch both sides ran with
        (:func:`helpers.conditions.sides`); in that order."""
        out, ran = Records(), self.ran or {}
        link = self.link
        out.add("link", "host-device link", "link_limit", link.limit_gbps, "GB/s", source=link.source,
                detail=link.detail, notes=list(link.notes), address=link.address, generation=link.generation,
                width=link.width)
        for method, ok in self.correct.items():
            out.add("correctness", method, "bit_exact", float(ok), "bool")
        for rec in bandwidth_records(self.summary, cache_bytes=self.cache_bytes, link_gbps=link.limit_gbps):
            out.add(**rec)
        shape = self.batch_shape if isinstance(self.batch_shape, str) else list(self.batch_shape)
        rows = self.batch_rows.set_index("method")
        first = True
        for c in self.comparisons.values():
            out.add_comparison("per-batch copy", c, shape=shape, nbytes=self.batch_bytes, **sides(self.ran, self.ran))
            for m in ((c.a,) if first else ()) + (c.b,):
                r = rows.loc[m.name]
                out.add_measurement("per-batch copy", m.name, m, metric="time_per_batch", unit="s", **ran)
                out.add("per-batch copy", m.name, "bandwidth", float(r["gbps"]), "GB/s", repeats=m.repeats,
                        spread={"p25": float(r["gbps_p25"]), "p75": float(r["gbps_p75"])})
            first = False
        return out

    def verdict(self) -> Verdict:
        """Notebook 04's verdict (:func:`verdict`) with :meth:`context`."""
        rows = self.batch_rows
        return verdict(self.comparisons, applicability=self.applicability, reference=self.reference,
                       link=self.link, batch_gbps=dict(zip(rows["method"], rows["gbps"])), context=self.context())

    def try_it(self, acc: "Accelerator", params: Mapping[str, Any]) -> TrySpec:
        """The "try it" panel: one copy at a size (the sweep's, or one batch's) and a method (the verdict's
        pinned method first, else pageable), beside this notebook's figure for that method at its largest size.

        Parameters
        ----------
        acc : helpers.device.Accelerator
        params : mapping
            The notebook's parameters (``repeats`` and ``warmup``, each capped at 10 and 2 for the panel).
        """
        sizes = sorted({(_kib_mib(n), n / 2**20) for n in self.sizes}
                       | {(f"one batch ({_kib_mib(self.batch_bytes)})", self.batch_bytes / 2**20)}, key=lambda o: o[1])
        start = self.verdict().extra["method"] or "pageable"
        methods = tuple((method_label(m), m) for m in TRY_METHODS) + (("all five, one point each", "all"),)
        knobs = {"size_mib": Knob(tuple(sizes), self.sizes[-1] / 2**20, "size"),
                 "method": Knob(methods, start, "method")}
        applicable, limit = self.applicability.applicable, self.link.limit_gbps
        own = self.table[(self.table["method"] == start) & (self.table["size_bytes"] == self.sizes[-1])]
        repeats, warmup = min(params["repeats"], 10), min(params["warmup"], 2)
        return TrySpec("host-to-device copy at another size and method",
                       lambda progress, **k: try_pinning(acc, repeats=repeats, warmup=warmup, link_gbps=limit,
                                                         progress=progress, **k),
                       knobs, reference=live_point(own.iloc[0], link_gbps=limit) if applicable and len(own) else None,
                       unavailable="" if applicable else (
                           f"{self.applicability.reason}: a copy on the CPU is no host-to-device transfer. The panel "
                           "measures on a CUDA GPU or an Ascend NPU, where it times each copy method's GB/s at the "
                           "size you pick"))


def _job_batch(job: Any) -> tuple[Any, int, str]:
    """A user's job's first host batch, its bytes and its description."""
    from helpers.jobs.base import close_dataset
    from helpers.jobs.check import describe_batch

    dataset = job.make_dataset(job.pipelines[0])
    try:
        batch = dataset[next(iter(job.batch_sampler(len(dataset))))]
    finally:
        close_dataset(dataset)
    return batch, batch_nbytes(batch), describe_batch(batch)


def _refusal(acc: "Accelerator") -> str:
    """What ``Tensor.pin_memory()`` raises without an accelerator (empty where one is there or it pins)."""
    if torch.accelerator.is_available():
        return ""
    try:
        torch.zeros(4).pin_memory()
    except RuntimeError as exc:
        return f"RuntimeError: {exc}"
    return ""


def run(ctx: Any, *, progress: Callable[[str], None] | None = None) -> PinningResult:
    """Notebook 04's experiment, in the notebook's order: the link, the sizes, the correctness check, the host
    memcpy and device sweeps, the summary and one batch per method.

    Parameters
    ----------
    ctx : helpers.workbook.nbsetup.NotebookContext
        The notebook's context: its parameters (``min_size_kib``, ``max_size_mib``, ``repeats``, ``warmup``,
        ``link_gbps``, ``batch_size``, ``image_size``, ``job``) and its accelerator; with ``job`` set, the
        user's job (``ctx.job()``), whose first batch is compared through its own ``to_device``.
    progress : callable, optional
        Called with a line per size of the device sweep (e.g. ``print``).

    Returns
    -------
    PinningResult

    Raises
    ------
    helpers.errors.DataError
        If a copy method returned other bytes than it was given.
    helpers.errors.ParameterError
        For sizes out of range (:func:`transfer_sizes`).
    """
    from helpers.diagnose.pcie import last_level_cache_bytes, link_limit
    from helpers.pipeline.transfer import check_methods

    P, acc = ctx.params, ctx.acc
    app = pinning_applicability(acc)
    link = link_limit(acc, P["link_gbps"])
    refusal = _refusal(acc)
    sizes = transfer_sizes(P["min_size_kib"], P["max_size_mib"])
    job = ctx.job() if P.get("job") else None  # the built-in batch needs no job: its shape is the parameters'
    if job is not None:
        host_batch, batch_bytes, batch_shape = _job_batch(job)
    else:
        batch_shape = (P["batch_size"], P["image_size"], P["image_size"], 3)
        batch_bytes = P["batch_size"] * P["image_size"] ** 2 * 3
    correct = check_methods(acc, nbytes=min(batch_bytes, 8 << 20)) if app.applicable else {}
    if not all(correct.values()):
        raise DataError(f"a copy method returned different bytes: {correct}")
    repeats, warmup = P["repeats"], P["warmup"]
    host = host_copy_sweep(sizes, repeats=repeats, warmup=warmup)
    sweep = (bandwidth_sweep(acc, sizes, repeats=repeats, warmup=warmup,
                             progress=progress)
             if app.applicable else bandwidth_sweep(acc, sizes))  # one "not applicable" row per method
    table = pd.concat([sweep[sweep["applicable"]], host], ignore_index=True)
    if link.limit_gbps:
        table["pct_of_link"] = 100 * table["gbps"] / link.limit_gbps
    cache = last_level_cache_bytes()
    summary = bandwidth_summary(table, cache_bytes=cache)
    batch_repeats = max(repeats, 10)
    ran = ran_with(job.workload.batch_size if job is not None else P["batch_size"])  # held over the comparisons
    if job is not None:  # pageable, pinned per batch and the loader's pin thread, on the job's own batch
        comparisons = job_batch_comparison(
            acc, host_batch, lambda b, non_blocking=False: job.to_device(b, acc, non_blocking=non_blocking),
            repeats=batch_repeats, warmup=warmup)
    else:
        comparisons = batch_comparison(acc, batch_shape, repeats=batch_repeats, warmup=warmup)
    return PinningResult(device=f"{acc.kind} ({acc.name})", applicability=app, refusal=refusal, link=link,
                         sizes=tuple(sizes), batch_shape=batch_shape, batch_bytes=int(batch_bytes),
                         job_name=None if job is None else job.name, correct=correct, table=table,
                         cache_bytes=cache, summary=summary, reference=memcpy_reference(summary, cache_bytes=cache),
                         comparisons=comparisons, repeats=repeats, warmup=warmup, ran=held(ran))


# -- the notebook's declaration, found by helpers.experiments.registry ------------------------------------

def _pinned_default(acc, native_bf16=None) -> tuple[bool, str]:
    """Pinned memory where no verdict decides it: on wherever the device has pinned host memory."""
    pinned = acc.capabilities.pinned_memory
    if not acc.is_cpu and pinned.available:
        return True, "pinned host buffers speed host-to-device copies"
    return False, f"not available here: {pinned.detail or 'no accelerator'}"


EXPERIMENT = Experiment(
    item=Item("04", "04_pinned_memory", "pinned memory",
         "Measure what pinned memory buys a host-to-device copy",
         "Pageable vs pinned vs a reused pinned buffer: host-to-device bandwidth vs size, as a share of the link",
         ("pinned_memory",)),
    spec=specs.COMMON + (
        Param("min_size_kib", int, 4, "smallest transfer, KiB", minimum=1, maximum=1 << 20),
        Param("max_size_mib", int, 256, "largest transfer, MiB", minimum=1, maximum=1 << 16),
        Param("repeats", int, 10, "timed copies per size and method", minimum=3, maximum=10000),
        Param("warmup", int, 2, "untimed copies per size and method", minimum=0, maximum=100),
        Param("link_gbps", float, 0.0, "host-device link limit, GB/s (0 reads it from sysfs where possible)",
              minimum=0.0, maximum=10000.0),
        Param("batch_size", int, DEFAULT.batch_size, "images per batch for the per-batch comparison", minimum=1, maximum=4096),
        Param("image_size", int, DEFAULT.image_size, "side of the square crop of that batch, px", minimum=16, maximum=1024),
    ) + specs.JOB,
    optimizations=(
        Optimization("pinned_memory", "04_pinned_memory", ("data", "h2d"), default=_pinned_default,
                     apply=lambda plan, settings, acc: replace(
                         plan, pin_memory=bool(acc.capabilities.pinned_memory.available))),
    ),
    interleaved_repeats="repeats",
)
