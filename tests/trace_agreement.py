"""Ground truth for the trace reader: notebook 01 times a job and profiles the same job; ``python -m helpers trace``
on that trace must give 01's label, with the exposed input share close to 01's own figure.

Notebook 01's section 7 reads the trace its section 4 wrote (``trace_path`` empty) and records the share as
experiment ``your trace``; the tests here compare that record with the timed ``baseline step`` record of the same
run, so no notebook is executed twice.
"""

from __future__ import annotations

from pathlib import Path

from helpers.results import load_results

#: The agreement the trace reader must reach with notebook 01's timing, in points of the step. Issue 23 aimed at 5
#: points; but the two figures come from two runs of the job, and the traced one carries the profiler's cost per
#: op, which lengthens compute and lowers the input share: CI once saw 68.0% traced against 74.7% timed on a
#: machine its check called quiet. A misread trace (a phase taken for another, steps miscounted) is off by tens of
#: points, so 12 points still catches it without failing on noise.
TOLERANCE = 0.12
BASELINE_LABELS = ("host-bound", "balanced", "device-bound")
#: Where helpers.bottleneck.classify turns balanced into host-bound: free input saves at least what a 2x faster
#: compute would, X >= (1 - X) / 2.
HOST_BOUND_SHARE = 1 / 3


def trace_agreement(run_dir: Path) -> tuple[float, float, str, str, bool]:
    """(timed share, traced share, timed label, traced label, machine busy) of notebook 01 in ``run_dir``."""
    df = load_results(Path(run_dir) / "results.jsonl")
    b = df[df["notebook"] == "01_baseline_profiling"]
    timed = b[(b["experiment"] == "baseline step") & (b["metric"] == "exposed_input_fraction")]
    traced = b[b["experiment"] == "your trace"]
    assert len(timed) == 1 and len(traced) == 1, (len(timed), len(traced))
    verdict = b[b["experiment"] == "verdict"].iloc[-1]
    row = traced.iloc[0]
    assert row["extra"]["trace"]["reader"] == "kineto" and row["extra"]["trace"]["bytes"] > 0  # provenance kept
    machine = verdict["extra"]["machine"]
    label = verdict["extra"].get("measured_recommendation") or verdict["recommendation"]
    return float(timed["value"].iloc[0]), float(row["value"]), label, row["extra"]["verdict"], bool(machine["busy"])


def assert_trace_agrees(run_dir: Path, threshold: float = 0.10) -> None:
    """The trace's share within :data:`TOLERANCE` of the timed one and the same label, on a quiet machine.

    On a busy machine (as notebook 01's own verdict records it) the timed share is itself not trusted, so only the
    trace's analysis is checked (a label, a share in [0, 1]). A timed share within the tolerance of a label boundary
    (the threshold, or :data:`HOST_BOUND_SHARE`) may give the neighbouring label.
    """
    timed, traced, label, traced_label, busy = trace_agreement(run_dir)
    assert 0.0 <= traced <= 1.0 and traced_label in BASELINE_LABELS and label in BASELINE_LABELS
    if busy:
        return
    assert abs(traced - timed) <= TOLERANCE, f"trace {traced:.1%} vs notebook 01's timing {timed:.1%}"
    near_boundary = any(abs(timed - edge) <= TOLERANCE for edge in (threshold, HOST_BOUND_SHARE))
    assert traced_label == label or near_boundary, (traced_label, label, timed)
