"""Notebook 09's result texts: what the cells of :class:`helpers.experiments.memory.MemoryResult` print (sentences
and display tables), the verdict's context sentence, and the allocator settings' table rows the records reuse.

:class:`MemoryResultTexts` is a mixin without fields, read by the result class, which holds the measurement.
"""

from __future__ import annotations

from typing import Any, Mapping

import pandas as pd

from helpers.compute.memory import MIB

__all__ = ["CPU_ALLOCATOR_WHY", "MemoryResultTexts"]

#: Why the allocator section does not apply on a CPU.
CPU_ALLOCATOR_WHY = ("the CPU allocator has no caching allocator settings (PYTORCH_*_ALLOC_CONF configure the CUDA "
                     "and NPU caching allocators) and no cache to empty: empty_cache does not exist for the CPU")


def _allocator_row(res: Mapping[str, Any]) -> dict[str, Any]:
    """One allocator setting's child result (:func:`run_alloc_conf_child`, ``ok``) as a table row: its peaks and
    fragmentation, and what ``empty_cache`` freed and cost (the medians of its rounds) where it was measured."""
    tr = pd.DataFrame(res["trace"])
    row = {"setting": res["alloc_conf"] or "(defaults)", "peak_mib": tr.peak_mib.max(),
           "reserved_mib": tr.reserved_mib.max(), "fragmentation": tr.fragmentation.mean()}
    ec = pd.DataFrame(res["empty_cache"]) if res["empty_cache"] else None
    if ec is not None:
        row.update(reserved_freed_mib=(ec.reserved_before_mib - ec.reserved_after_mib).median(),
                   allocated_change_mib=(ec.allocated_after_mib - ec.allocated_before_mib).median(),
                   empty_cache_ms=ec.empty_cache_ms.median(),
                   next_step_extra_ms=(ec.next_step_ms - ec.steady_step_ms).median())
    return row


class MemoryResultTexts:
    """The texts of :class:`helpers.experiments.memory.MemoryResult` (sections 1-3) and its context."""

    def trace_text(self) -> str:
        """Section 1: memory after the traced steps."""
        trace, last = self.trace, self.trace.iloc[-1]
        if trace["source"].iloc[0] == "device":
            return (f"after {len(trace)} steps: allocated {last.allocated_mib:.1f} MiB, reserved "
                    f"{last.reserved_mib:.1f} MiB, peak per step up to {trace.peak_mib.max():.1f} MiB, "
                    f"fragmentation {last.fragmentation:.1%}")
        return (f"CPU: no device allocator; process memory instead. After {len(trace)} steps: RSS "
                f"{last.rss_mib:.0f} MiB, USS {last.uss_mib:.0f} MiB; largest RSS seen in a step "
                f"{trace.peak_mib.max():.0f} MiB (sampled: a lower bound)")

    def allocator_text(self) -> str:
        """Section 2: why it does not apply (CPU), or each setting that failed in its child."""
        if self.is_cpu:
            return f"not applicable on CPU: {CPU_ALLOCATOR_WHY}"
        failed = [f"{self.alloc_conf_var}={r['alloc_conf'] or '(defaults)'}: the child failed: {r['error']}"
                  for r in self.allocator if not r["ok"]]
        ran = sum(bool(r["ok"]) for r in self.allocator)
        return "\n".join(failed + [f"{ran} of {len(self.allocator)} setting(s) traced in a child process each"])

    def allocator_table(self) -> pd.DataFrame | None:
        """Section 2: one row per setting whose child ran (None when none did, or on a CPU)."""
        rows = [_allocator_row(r) for r in self.allocator if r["ok"]]
        return pd.DataFrame(rows).round(2) if rows else None

    def finder_text(self) -> str:
        """Section 3: the budget, each size tried, why growing stopped and the largest size that fits."""
        lines = [f"budget: {self.budget_bytes / MIB:,.0f} MiB, {self.budget_why}; a size fits below "
                 f"{self.finder.limit_bytes / MIB:,.0f} MiB ({self.safety_margin:.0%} margin)"]
        if self.is_cpu:
            lines.append("CPU: the figure per size is the process's RSS growth over the finder's start, sampled (a "
                         "lower bound of the true peak)")
        for row in self.found.frame.to_dict("records"):
            lines.append(f"  batch {row['batch']:>5} ({row['phase']}): {row['status']:<11} {self.used_name} "
                         f"{row['peak_mib']:8.1f} MiB  {row['throughput']:8.1f} samples/s"
                         + (f"  [{row['error'][:90]}]" if row["error"] else ""))
        return "\n".join(lines + [f"stopped: {self.found.stop_reason}",
                                  f"largest batch that fits: {self.found.largest_fit_text()}"])

    def comparison_text(self) -> str:
        """Section 3: the throughput-best size against the current one, interleaved (or why not compared)."""
        c, gain = self.comparison, self.gain
        if c is None:
            return self.compare_note
        tp, cur, best = self.finder_throughput, self.batch_size, self.best
        return (f"finder ({self.finder_steps} steps, no interval): batch {best} {tp[best]:.1f} samples/s vs "
                f"{tp.get(cur, float('nan')):.1f} at the current {cur}\n"
                f"interleaved, {self.steps} steps each: batch {best} {c.b.rate:.1f} vs batch {cur} {c.a.rate:.1f} "
                f"samples/s = {gain[0]:.2f}x (95% CI {gain[1]:.2f}-{gain[2]:.2f})")

    @property
    def context(self) -> str:
        """What was measured, in the verdict's one sentence."""
        frame = self.found.frame
        return (f"{self.what}, on {self.device_kind} ({self.device_name}); batch sizes "
                f"{', '.join(str(b) for b in frame.batch)} tried, {self.finder_steps} timed steps each"
                + (f"; throughput-best {self.best} vs current {self.batch_size} interleaved, {self.steps} steps each"
                   if self.gain else "")
                + f"; budget {self.budget_bytes / MIB:,.0f} MiB, "
                + ("set by memory_budget_mib" if self.budget_set else self.budget_why)
                + f", safety margin {self.safety_margin:.0%}; memory per size = "
                + ("sampled process RSS growth" if self.is_cpu else "device max_memory_allocated"))
