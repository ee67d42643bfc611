"""Notebook 04's result texts: what the cells of :class:`helpers.experiments.pinning.PinningResult` print (sentences
and display tables) and the verdict's context sentence.

:class:`PinningResultTexts` is a mixin without fields, read by the result class, which holds the measurement.
"""

from __future__ import annotations

import pandas as pd

from helpers.pipeline.transfer import METHODS
from helpers.pipeline.transfer_bench import method_label

__all__ = ["PinningResultTexts"]


def _kib_mib(nbytes: float) -> str:
    """A size as notebook 04 prints it: MiB from 1 MiB up, else KiB (``"384 KiB"``, ``"256 MiB"``)."""
    return f"{nbytes / 2**20:g} MiB" if nbytes >= 2**20 else f"{nbytes / 2**10:g} KiB"


class PinningResultTexts:
    """The texts of :class:`helpers.experiments.pinning.PinningResult` (sections 1-4) and its context."""

    @staticmethod
    def size_text(nbytes: float) -> str:
        """A size as the notebook prints it: MiB from 1 MiB up, else KiB (``"384 KiB"``)."""
        return _kib_mib(nbytes)

    def link_text(self) -> str:
        """Section 1: whether pinning applies, what torch says when asked to pin here, the link and its notes."""
        lines = [self.applicability.reason]
        if self.refusal:
            lines.append(f"what torch says when asked to pin here: {self.refusal}")
        lines.append(f"link: {self.link.detail}")
        lines += [f"note: {note}" for note in self.link.notes]
        return "\n".join(lines)

    def sizes_text(self) -> str:
        """Section 2: the sweep's sizes, the batch of section 4 and the methods."""
        if self.job_name is not None:
            batch = f"one batch of your job {self.job_name!r}: {self.batch_shape} = {_kib_mib(self.batch_bytes)}"
        else:
            batch = f"one batch: uint8 NHWC {self.batch_shape} = {_kib_mib(self.batch_bytes)}"
        return "\n".join([f"{len(self.sizes)} transfer sizes from {_kib_mib(self.sizes[0])} to "
                          f"{_kib_mib(self.sizes[-1])}", batch,
                          "methods: " + "; ".join(f"{m} ({method_label(m)})" for m in METHODS)])

    def correctness_text(self) -> str:
        """Section 2: each method's round trip, bit-exact or not (or why it was skipped)."""
        if not self.applicability.applicable:
            return f"skipped: {self.applicability.reason}"
        return "\n".join(f"{method:18s} {'bit-exact' if ok else 'WRONG BYTES'}" for method, ok in self.correct.items())

    def summary_text(self) -> str:
        """Section 3: the last-level cache and the host memcpy's reference figure (with its advice)."""
        cache = _kib_mib(self.cache_bytes) if self.cache_bytes else "unknown (sysfs does not describe it)"
        lines = [f"last-level cache: {cache}",
                 f"host memcpy reference: {self.reference['gbps']:.1f} GB/s, {self.reference['label']}"]
        if self.reference["advice"]:
            lines.append(f"note: {self.reference['advice']}")
        return "\n".join(lines)

    def summary_table(self) -> pd.DataFrame:
        """Per method: its peak and its rate at the largest size (GB/s), with the size and regime of each, and
        the peak as a % of the link where its limit is known."""
        rows = []
        for r in self.summary.itertuples():
            row = {"method": r.label, "peak GB/s": r.peak_gbps,
                   "peak at": f"{_kib_mib(r.peak_size_bytes)} ({r.peak_regime})", "GB/s at largest": r.largest_gbps,
                   "largest": f"{_kib_mib(r.largest_size_bytes)} ({r.largest_regime})"}
            if self.link.limit_gbps and r.method != "host_memcpy":
                row["peak % of link"] = 100 * r.peak_gbps / self.link.limit_gbps
            rows.append(row)
        return pd.DataFrame(rows)

    def batch_text(self) -> str:
        """Section 4: each pinned method against pageable in a sentence (or why nothing was compared)."""
        if not self.comparisons:
            return f"skipped: {self.applicability.reason}"
        return "\n".join(c.verdict_text() for c in self.comparisons.values())

    def context(self) -> str:
        """What was measured, in the verdict's one sentence (batch, sizes, repeats, device, link)."""
        what = (f"your job {self.job_name!r}'s batch ({self.batch_shape})" if self.job_name is not None
                else f"uint8 NHWC batch {self.batch_shape}")
        return (f"{what} = {_kib_mib(self.batch_bytes)}, sizes {_kib_mib(self.sizes[0])} to "
                f"{_kib_mib(self.sizes[-1])}, {self.repeats} repeats after {self.warmup} warm-up, on {self.device}; "
                f"link: {self.link.detail}")
