"""The prepared accelerator check: the device notebooks, the input benchmark and the link, in one JSON summary.

``python -m helpers device-check --device cuda`` (``make device-check``) is meant for a short loan of a CUDA
(or Ascend) machine: one command that runs, within about 8 minutes on the quick profile,

- notebooks 02, 04, 05, 06, 07 and 10 on the device (the runner, so every record, figure and verdict lands in
  a normal run folder with its report),
- ``bench input-pipeline`` on the device (decode, preprocessing and overlap figures),
- the pinned-vs-pageable host-to-device bandwidth from notebook 04's records, each as a share of the link's
  limit where the link is known (public anchor: about 55 GB/s pinned on PCIe Gen5 x16),
- real profiler traces of a host-bound and a device-bound loop on the device, read back by the trace command and
  timed by the instrument, whose verdicts must flip (:mod:`helpers.workbook.trace_check`),
- ``workbook tune`` on ``examples/device_habits.py``, the one place tune's device-only candidates (TF32/HF32, host
  synchronisations, tensors made on the device) are measured (:mod:`helpers.workbook.tune_check`; a few minutes,
  last, after the summary is written once without it),

and writes ``device_check.json`` beside the run folder. A step that fails is recorded with its error and the
others still run. On a machine without the accelerator the same command runs with ``--device cpu``: the device
parts then say "not applicable" (that is what the tests run).
"""

from __future__ import annotations

import json
import time
import traceback
from pathlib import Path
from typing import Any, Callable

from helpers.fsutil import write_atomic

__all__ = ["DEVICE_NOTEBOOKS", "device_check", "bandwidth_summary"]

#: The notebooks whose mechanisms need an accelerator to show (issue 14's list).
DEVICE_NOTEBOOKS: tuple[str, ...] = ("02", "04", "05", "06", "07", "10")


def bandwidth_summary(results_path: str | Path) -> dict[str, Any]:
    """Notebook 04's host-to-device rates: pinned (DMA reference and per method) and pageable, and the link.

    Parameters
    ----------
    results_path : path
        A run's ``results.jsonl``.

    Returns
    -------
    dict
        ``link_gbps`` (the link's limit, GB/s = 1e9 B/s, or None when unknown), ``link_source``, and per method
        of notebook 04's sweep (``pageable``, ``pin_per_batch``, ``loader_pin_thread``, ``pinned_buffer``,
        ``pinned_copy_only``) its ``peak_gbps``, ``largest_gbps`` and ``peak_share_of_link``; ``pinned_over_pageable``
        (peak of the DMA reference over pageable's); empty methods where nothing was copied (a CPU).
    """
    from helpers.results import load_results

    df = load_results(results_path)
    df = df[df["notebook"].astype(str).str.startswith("04")] if len(df) else df
    out: dict[str, Any] = {"link_gbps": None, "link_source": None, "methods": {}}
    if not len(df):
        return out
    link = df[df["metric"] == "link_limit"]
    if len(link):
        extra = link["extra"].iloc[-1] if "extra" in link else None
        out["link_source"] = (extra or {}).get("source") if isinstance(extra, dict) else None
        if link["value"].notna().any():
            out["link_gbps"] = float(link["value"].dropna().iloc[-1])
    bw = df[df["experiment"] == "h2d bandwidth"]
    for method in dict.fromkeys(bw["variant"]):
        rows = bw[bw["variant"] == method]
        get = {m: rows[rows["metric"] == m]["value"] for m in ("peak_bandwidth", "bandwidth_at_largest_size")}
        peak = float(get["peak_bandwidth"].iloc[-1]) if len(get["peak_bandwidth"]) else None
        largest = (float(get["bandwidth_at_largest_size"].iloc[-1]) if len(get["bandwidth_at_largest_size"])
                   else None)
        share = peak / out["link_gbps"] if peak is not None and out["link_gbps"] else None
        out["methods"][str(method)] = {"peak_gbps": peak, "largest_gbps": largest, "peak_share_of_link": share}
    m = out["methods"]
    if m.get("pinned_copy_only", {}).get("peak_gbps") and m.get("pageable", {}).get("peak_gbps"):
        out["pinned_over_pageable"] = m["pinned_copy_only"]["peak_gbps"] / m["pageable"]["peak_gbps"]
    return out


def _step(name: str, fn: Callable[[], Any], steps: dict[str, Any], echo: Callable[[str], None]) -> Any:
    t0 = time.perf_counter()
    echo(f"device-check: {name} ...")
    try:
        value = fn()
        steps[name] = {"status": "ok", "wall_s": round(time.perf_counter() - t0, 1)}
        return value
    except Exception as exc:  # noqa: BLE001 - one failing step must not lose the others' figures
        steps[name] = {"status": "failed", "wall_s": round(time.perf_counter() - t0, 1),
                       "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-2000:]}
        echo(f"device-check: {name} failed: {type(exc).__name__}: {exc}")
        return None


def device_check(*, device: str = "cuda", out: str | Path | None = None, profile: str = "quick",
                 notebooks: tuple[str, ...] = DEVICE_NOTEBOOKS, timeout_s: float = 480.0,
                 echo: Callable[[str], None] = print) -> dict[str, Any]:
    """Run the device notebooks, the input benchmark and the bandwidth summary; write ``device_check.json``.

    Parameters
    ----------
    device : str
        ``cuda``, ``npu``, ``cpu`` or ``auto`` (validated by the runner before any work).
    out : path, optional
        Folder for the run and the summary (default ``runs/device-check-<device>-<time>``).
    profile : str
        The runner's profile (default quick).
    notebooks : tuple of str
        Notebook numbers to run (default :data:`DEVICE_NOTEBOOKS`).
    timeout_s : float
        Per-notebook timeout, seconds.
    echo : callable
        Progress lines.

    Returns
    -------
    dict
        ``device``, ``profile``, ``run_dir``, ``steps`` (per step: status, wall_s, error), ``notebooks`` (per
        notebook: status, recommendation, value, unit, reason), ``bench_input_pipeline`` (its JSON or None),
        ``bandwidth`` (:func:`bandwidth_summary`), ``traces`` (:func:`helpers.workbook.trace_check.trace_flip`:
        each loop's verdict by the trace and by the instrument, and whether they flip), ``tune``
        (:func:`helpers.workbook.tune_check.tune_example`), ``wall_s``. Also written to ``<out>/device_check.json``.

    Raises
    ------
    helpers.errors.ParameterError
        An unknown device or profile (before any work).
    """
    from helpers.workbook.bench import input_pipeline
    from helpers.workbook.paths import runs_dir
    from helpers.workbook.profiles import load_profile
    from helpers.workbook.runner import RunOptions, run

    load_profile(profile)  # a bad name stops here, before any work
    t0 = time.perf_counter()
    root = Path(out) if out else runs_dir() / f"device-check-{device}-{time.strftime('%Y%m%d-%H%M%S')}"
    root.mkdir(parents=True, exist_ok=True)
    steps: dict[str, Any] = {}
    run_dir = root / "run"
    state = _step("notebooks", lambda: run(RunOptions(profile=profile, device=device, only=tuple(notebooks),
                                                      out=str(run_dir), timeout_s=timeout_s), echo=echo)[1],
                  steps, echo)
    summary: dict[str, Any] = {"device": device, "profile": profile, "run_dir": str(run_dir), "steps": steps}
    nbs: dict[str, Any] = {}
    results = run_dir / "results.jsonl"
    if results.is_file():
        from helpers.results import load_results, verdicts

        table = verdicts(load_results(results))
        for _, r in table.iterrows():
            value = r.get("value")
            nbs[str(r["notebook"])] = {"recommendation": r["recommendation"], "reason": str(r["reason"]),
                                       "value": None if value is None or value != value else float(value),
                                       "unit": r.get("unit")}
    if state is not None:
        for nb in state.notebooks:
            nbs.setdefault(nb.id, {})["status"] = nb.status
            if nb.error:
                nbs[nb.id]["error"] = str(nb.error)[-500:]
    summary["notebooks"] = nbs
    bench = _step("bench input-pipeline", lambda: input_pipeline(profile=profile, device=device), steps, echo)
    summary["bench_input_pipeline"] = bench
    summary["bandwidth"] = (_step("bandwidth", lambda: bandwidth_summary(results), steps, echo)
                            if results.is_file() else None)
    if summary["bandwidth"] is not None and not summary["bandwidth"]["methods"] and steps.get("bandwidth"):
        steps["bandwidth"]["status"] = "not applicable"  # nothing was copied to a device (a CPU)
        steps["bandwidth"]["reason"] = "notebook 04 recorded no host-to-device rate: no accelerator in this run"
    from helpers.workbook.trace_check import trace_flip

    summary["traces"] = _step("traces", lambda: trace_flip(device, root / "traces", echo=echo), steps, echo)
    flip = summary["traces"]
    if isinstance(flip, dict) and "ok" in flip and not flip["ok"]:
        steps["traces"]["status"] = "failed"
        steps["traces"]["error"] = f"the verdicts did not flip: {flip['flips']}"
    elif isinstance(flip, dict) and flip.get("status") == "not applicable":
        steps["traces"].update(status="not applicable", reason=flip["reason"])
    summary["wall_s"] = round(time.perf_counter() - t0, 1)
    write_atomic(root / "device_check.json", json.dumps(summary, indent=2, default=str))  # kept if tune is cut off
    from helpers.workbook.tune_check import tune_example

    summary["tune"] = _step("tune", lambda: tune_example(device, root / "tune", echo=echo), steps, echo)
    if isinstance(summary["tune"], dict) and summary["tune"].get("status") == "not applicable":
        steps["tune"].update(status="not applicable", reason=summary["tune"]["reason"])
    summary["wall_s"] = round(time.perf_counter() - t0, 1)
    write_atomic(root / "device_check.json", json.dumps(summary, indent=2, default=str))
    echo(f"device-check: summary {root / 'device_check.json'} ({summary['wall_s']:.0f} s)")
    return summary
