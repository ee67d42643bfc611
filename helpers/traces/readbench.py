"""Time one :func:`~helpers.traces.kineto.read_kineto` in a process of its own (``python -m helpers.traces.readbench``).

The ``bench trace`` command (helpers/workbook/bench.py) runs this module as a child process, so that the peak
resident memory it reports is the reader's (plus the interpreter and numpy) and not the generator's. It prints
one JSON object on stdout: ``read_s`` (wall seconds of the read), ``peak_rss_mib`` and ``rss_before_mib``
(the peak resident memory of this process after and before the read, MiB), ``steps`` (the steps read, as dicts of
:class:`~helpers.traces.model.StepPhases` fields), ``events``, ``parse``. A tqdm bar (stderr) shows the bytes read
once the read has taken 2 s.

``python -m helpers.traces.readbench --hta FOLDER`` times Holistic Trace Analysis instead (where it is installed,
the ``test`` extra; the workbook never needs it): ``TraceAnalysis(trace_dir=FOLDER)`` and its
``get_temporal_breakdown``, and prints ``read_s``, ``peak_rss_mib``, ``rss_before_mib`` and ``temporal`` (HTA's
idle, compute and non-compute %, per rank).
"""

from __future__ import annotations

import dataclasses
import json
import resource
import sys
import time


def _rss_mib() -> float:
    """Peak resident memory of this process, MiB: VmHWM (Linux), else ru_maxrss.

    Not ru_maxrss first: on Linux it carries over the parent's peak through fork and exec, so a child started
    by a large parent would report the parent's memory.
    """
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux, bytes on macOS


def _hta(folder: str) -> int:
    """Time HTA on ``folder`` (its rank files) and print the figures; exit 2 where HTA raises."""
    import contextlib
    import warnings

    from hta.trace_analysis import TraceAnalysis

    before = _rss_mib()
    t0 = time.perf_counter()
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(sys.stderr):  # stdout is for the figures
            warnings.simplefilter("ignore")
            analysis = TraceAnalysis(trace_dir=folder)
            df = analysis.get_temporal_breakdown(visualize=False)
    except Exception as exc:  # noqa: BLE001 - whatever HTA raises is reported, not fixed
        hint = ""
        if "for dtype 'int16'" in str(exc):  # HTA 0.5.0 under pandas 3 (tests/tools/hta_reference.py says why)
            hint = " (HTA 0.5.0 under pandas 3 on a trace of more than 32,767 events: run it with pandas 2.3.3)"
        print(f"error: HTA raised {type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}{hint}",
              file=sys.stderr)
        return 2
    read_s = time.perf_counter() - t0
    temporal = {str(int(r["rank"])): {"idle_pct": float(r["idle_time_pctg"]),
                                     "compute_pct": float(r["compute_time_pctg"]),
                                     "non_compute_pct": float(r["non_compute_time_pctg"])}
                for r in df.to_dict("records")}
    print(json.dumps({"read_s": read_s, "peak_rss_mib": round(_rss_mib(), 1), "rss_before_mib": round(before, 1),
                      "temporal": temporal}))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Read the trace named in ``argv`` (default: sys.argv[1:]) and print the figures; exit 2 on a TraceError."""
    from tqdm import tqdm

    from helpers.traces.kineto import read_kineto
    from helpers.traces.model import TraceError

    args = sys.argv[1:] if argv is None else argv
    if len(args) == 2 and args[0] == "--hta":
        return _hta(args[1])
    if len(args) != 1:
        print("usage: python -m helpers.traces.readbench TRACE.json | --hta FOLDER", file=sys.stderr)
        return 2
    before = _rss_mib()
    bar = tqdm(total=0, unit="B", unit_scale=True, desc="reading trace", file=sys.stderr, delay=2.0,
               mininterval=0.5)

    def progress(done: int, total: int) -> None:
        bar.total = total
        bar.update(done - bar.n)  # tqdm shows the bar only once ``delay`` has passed

    t0 = time.perf_counter()
    try:
        rt = read_kineto(args[0], progress=progress)
    except TraceError as exc:
        bar.close()
        print(f"error: {exc}", file=sys.stderr)
        return 2
    read_s = time.perf_counter() - t0
    bar.close()
    print(json.dumps({"read_s": read_s, "peak_rss_mib": round(_rss_mib(), 1), "rss_before_mib": round(before, 1),
                      "events": rt.provenance.get("events"), "parse": rt.provenance.get("parse"),
                      "device_kind": rt.device_kind, "steps": [dataclasses.asdict(s) for s in rt.steps]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
