"""Record a host-bound and a device-bound loop on this machine, read both back, and check that the verdicts flip.

The device check's trace step (``python -m helpers device-check``, :mod:`helpers.workbook.device_check`): two
small training loops, each run once under ``torch.profiler`` (``tensorboard_trace_handler``, the CPU and, on CUDA,
the device's activity) and under the three-line instrument (:func:`helpers.workbook.instrument.instrument`) at the
same time:

- **host-bound**: a DataLoader (``num_workers=0``) whose dataset waits :data:`SAMPLE_WAIT_S` per sample (the time a
  slow decode would take) feeds a one-layer model: the step waits for its input;
- **device-bound**: a DataLoader handing over batches already made feeds a stack of large ``Linear`` layers: the
  device (or, on a CPU, the cores) computes for almost the whole step.

Each trace folder is then read as ``python -m helpers trace`` reads it (:func:`helpers.traces.read`,
:func:`helpers.traces.analysis.analyze`), and the instrument's own report is taken; the check passes when both
tools call the first loop host-bound and the second device-bound. On a CPU the device-bound loop is
compute-bound on the cores, which the CPU trace measures as compute: the same rule, run here by the tests. On an
Ascend NPU, torch.profiler does not record the device (torch_npu has its own profiler), so the step says "not
applicable" there.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

__all__ = ["LOOPS", "SAMPLE_WAIT_S", "record_loop", "trace_flip"]

#: The host-bound loop's wait per sample, seconds: 2 ms, the order of a JPEG decode and augmentation of one
#: ImageNet-sized image on one core (notebook 02 measures it on this machine).
SAMPLE_WAIT_S = 0.002
#: The two loops, in the order they are run.
LOOPS: tuple[str, ...] = ("host-bound", "device-bound")
#: Profiled steps (after one waiting and one warm-up step) and the instrument's warm-up.
ACTIVE_STEPS, INSTRUMENT_WARMUP = 6, 2


def _loop_parts(kind: str, device: str):
    """(loader, model) of one loop; sizes that make the device-bound loop compute for most of its step on a CUDA
    GPU and on a 2-core CPU alike, within a few seconds."""
    import torch
    from torch.utils.data import DataLoader, Dataset

    torch.manual_seed(0)
    if kind == "host-bound":
        class SlowSamples(Dataset):
            def __len__(self):
                return 4096

            def __getitem__(self, i):
                time.sleep(SAMPLE_WAIT_S)
                return torch.randn(64), torch.randint(0, 10, ()).long()

        loader = DataLoader(SlowSamples(), batch_size=16, num_workers=0)
        model = torch.nn.Linear(64, 10)
    else:
        width, batch, layers = (4096, 2048, 8) if device == "cuda" else (512, 128, 4)
        # whole batches made once: the loader only hands them over (batch_size=None), so input costs ~nothing
        batches = [(torch.randn(batch, width), torch.randint(0, 10, (batch,))) for _ in range(4)]
        loader = DataLoader(batches * 4, batch_size=None, num_workers=0)
        model = torch.nn.Sequential(*[m for _ in range(layers) for m in (torch.nn.Linear(width, width),
                                                                          torch.nn.ReLU())],
                                    torch.nn.Linear(width, 10))
    return loader, model.to(device)


def record_loop(kind: str, device: str, folder: str | Path) -> Any:
    """Run one loop (``kind`` in :data:`LOOPS`) on ``device`` under the profiler and the instrument.

    Returns
    -------
    helpers.workbook.instrument_report.LoopReport
        The instrument's report of the loop (not printed); the trace is written into ``folder``.

    Raises
    ------
    ValueError
        An unknown ``kind``.
    """
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

    from helpers.workbook.instrument import instrument

    if kind not in LOOPS:
        raise ValueError(f"kind must be one of {LOOPS}, got {kind!r}")
    loader, model = _loop_parts(kind, device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    steps = instrument(loader, device=device, warmup=INSTRUMENT_WARMUP, name=f"the {kind} loop")
    total = 2 + ACTIVE_STEPS
    with profile(activities=activities, schedule=schedule(wait=1, warmup=1, active=ACTIVE_STEPS, repeat=1),
                 on_trace_ready=tensorboard_trace_handler(str(folder))) as prof:
        for i, (x, y) in enumerate(steps):
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            steps.copied()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            steps.loss(loss)
            prof.step()
            if i + 1 >= total:
                break
    return steps.report(print_it=False)


def trace_flip(device: str, out: str | Path, *, echo: Callable[[str], None] = print) -> dict[str, Any]:
    """Record both loops on ``device`` into ``out/<loop>/`` and give each tool's verdict on each.

    Returns
    -------
    dict
        ``device``; per loop (``host-bound``, ``device-bound``): ``trace`` (``label``, ``exposed_fraction``,
        ``compute_share`` and ``idle_share`` of the median step, ``limits``), ``instrument`` (``label``, its
        ``exposed_fraction``), ``folder``; ``flips`` (per tool, whether the first loop is host-bound and the second
        device-bound); ``ok`` (both flip). On an NPU: ``{"status": "not applicable", "reason": ...}``.
    """
    from helpers.bottleneck import DEVICE_BOUND, HOST_BOUND
    from helpers.traces import read
    from helpers.traces.analysis import analyze

    if device == "npu":
        return {"status": "not applicable", "reason": "torch.profiler does not record an Ascend NPU's activity "
                "(torch_npu.profiler does); read a torch_npu profiler folder with `python -m helpers trace` instead"}
    out = Path(out)
    summary: dict[str, Any] = {"device": device}
    for kind in LOOPS:
        folder = out / kind
        folder.mkdir(parents=True, exist_ok=True)
        echo(f"device-check: recording the {kind} loop on {device} ...")
        rep = record_loop(kind, device, folder)
        ta = analyze(read(folder))
        job = ta.job
        sh = job.shares
        summary[kind] = {
            "folder": str(folder),
            "trace": {"label": ta.label, "exposed_fraction": job.exposed_fraction,
                      "compute_share": None if sh is None else sh.compute,
                      "idle_share": None if sh is None else sh.idle, "device_kind": job.provenance.get("device_kind"),
                      "limits": list(ta.limits)},
            "instrument": {"label": rep.measured_recommendation, "exposed_fraction": rep.exposed_fraction},
        }
        echo(f"device-check: {kind} loop: trace says {ta.label} (exposed input {_pct(job.exposed_fraction)}), the "
             f"instrument says {rep.measured_recommendation} (exposed input {_pct(rep.exposed_fraction)})")
    summary["flips"] = {tool: summary["host-bound"][tool]["label"] == HOST_BOUND
                        and summary["device-bound"][tool]["label"] == DEVICE_BOUND
                        for tool in ("trace", "instrument")}
    summary["ok"] = all(summary["flips"].values())
    return summary


def _pct(x: float | None) -> str:
    return "unmeasured" if x is None else f"{x:.0%}"
