"""Benchmarks as commands: ``python -m helpers bench <name>`` prints one JSON object.

Benchmarks report ratios measured in one run (never absolute speeds compared
with a hard-coded number in a test). Targets, where the project has set them,
are reported next to the measured value with whether they were met on this
machine; they do not change the exit status.
"""

from __future__ import annotations

import inspect
import json
import time
from typing import Any, Callable

from helpers import machine
from helpers.npu_probe import prepare_torch_import
from helpers.specs import spec_for, validate_notebook_params
from helpers.workbook.runner import load_profile

#: Targets of issue 3 for a 2-core CPU, quick profile, embedded data.
INPUT_PIPELINE_TARGETS = {
    "preprocess_speedup": (">=", 4.0),
    "decode_efficiency": (">=", 0.70),
    "exposed_input_fraction": ("<=", 0.10),
}


def _kwargs_for(fn: Callable, notebook: str, profile: str, overrides: dict) -> dict:
    """Parameters of ``notebook`` under ``profile`` (validated), restricted to ``fn``'s keywords."""
    prof = load_profile(profile)
    values = {p.name: p.default for p in spec_for(notebook)}
    values.update(prof.get("common") or {})
    values.update(prof.get(notebook) or {})
    values.update({k: v for k, v in overrides.items() if v is not None})
    values = validate_notebook_params(notebook, values, allow_unknown=True)
    accepted = set(inspect.signature(fn).parameters)
    out = {k: v for k, v in values.items() if k in accepted}
    if "data_dir" in out and not out["data_dir"]:
        out["data_dir"] = None
    return out


def _met(value: float | None, rule: tuple[str, float]) -> bool | None:
    if value is None:
        return None
    op, target = rule
    return value >= target if op == ">=" else value <= target


def input_pipeline(*, profile: str = "quick", device: str = "auto", data_dir: str | None = None) -> dict[str, Any]:
    """Figures of the input-pipeline work (notebooks 02 and 05) in one JSON-able dict.

    Keys: ``preprocess_speedup`` (batched images/s over per-image images/s),
    ``decode_efficiency`` (batched rate over the raw decode-only rate of the same
    decoder at the same thread count), ``tokenize_speedup`` (per-sample over
    batched tokenization time), ``exposed_input_fraction`` (exposed input time
    over step time with workers and the prefetcher in place), ``targets`` (each
    target, the measured value and whether it was met), ``decode`` and
    ``overlap`` (the full results), ``profile``, ``device``, ``duration_s``.
    """
    prepare_torch_import(fallback_to_cpu=True)
    # imported only now: these import torch, which must not happen before the torch_npu probe has decided
    # whether torch_npu may autoload (a broken install would otherwise crash this process on import)
    from helpers.device import get_accelerator
    from helpers.experiments.decode import input_decode_bench
    from helpers.experiments.overlap import overlap_bench
    from helpers.pipeline.prepare import prepare_data

    kind = get_accelerator(device).kind
    t0 = time.perf_counter()
    before = machine.snapshot()
    overrides = {"device": kind, "data_dir": data_dir}
    kw_decode = _kwargs_for(input_decode_bench, "02_batched_decode", profile, overrides)
    kw_overlap = _kwargs_for(overlap_bench, "05_stream_overlap", profile, overrides)
    data_keys = ("data_dir", "max_images", "seed", "text_len")
    if all(kw_decode.get(k) == kw_overlap.get(k) for k in data_keys):
        # one scan of the folder (and one report of its bad files) for both benchmarks
        prepared = prepare_data(kw_decode.get("data_dir"), max_images=kw_decode.get("max_images", 0),
                                seed=kw_decode.get("seed", 0), text_len=kw_decode["text_len"],
                                batch_size=max(kw_decode["batch_size"], kw_overlap["batch_size"]))
        kw_decode["prepared"] = kw_overlap["prepared"] = prepared
    decode = input_decode_bench(**kw_decode)
    overlap = overlap_bench(**kw_overlap)
    out = {
        "skipped_files": decode.get("skipped_files"),
        "preprocess_speedup": decode.get("preprocess_speedup"),
        "decode_efficiency": decode.get("decode_efficiency"),
        "tokenize_speedup": decode.get("tokenize_speedup"),
        "exposed_input_fraction": overlap.get("exposed_input_fraction"),
    }
    out["targets"] = {k: {"rule": f"{op} {t}", "value": out[k], "met": _met(out[k], (op, t))}
                      for k, (op, t) in INPUT_PIPELINE_TARGETS.items()}
    out.update(decode=decode, overlap=overlap, profile=profile, device=kind,
               duration_s=round(time.perf_counter() - t0, 2))
    out.update(_machine_keys(before))
    return out


def _machine_keys(before: machine.MachineState) -> dict:
    """``machine`` (the busy-machine check since ``before``) and ``machine_note`` (its sentence): a figure measured
    on a busy machine says so beside it (:mod:`helpers.machine`)."""
    c = machine.check(before, machine.snapshot())
    return {"machine": c.as_dict(), "machine_note": c.sentence()}


def allreduce_bench(*, backend: str = "auto", world_size: int = 2, min_bytes: int = 8, max_size_mib: float = 256,
                    repeats: int = 10, warmup: int = 3, timeout_s: float = 600.0, master_port: int = 0,
                    device: str = "auto") -> str | None:
    """The allreduce benchmark (issue 5) as a JSON string.

    Started by hand, it launches ``world_size`` ranks under torchrun on this
    machine (:func:`helpers.comm.allreduce.allreduce_benchmark`). Started by
    torchrun itself (RANK, WORLD_SIZE and MASTER_ADDR set, e.g. on several
    nodes), it runs as that rank; rank 0 returns the JSON, other ranks None.
    Keys: backend, world_size, device, sizes (bytes, time_s, time_p25_s,
    time_p75_s, algbw_gbps, busbw_gbps, repeats; GB/s = 1e9 B/s), bare,
    overhead_vs_bare, overhead_statistic, bare_busbw_gbps, bare_bytes
    (bare_note when that is not 64 MiB), target, met, timing, wall_s.

    Raises
    ------
    ParameterError, DeviceUnavailableError
        Bad values or an unavailable backend (the ``bench`` command exits 2).
    TimeoutError, RuntimeError
        The job hung or a rank failed (the ``bench`` command prints
        ``error: ...`` and exits 1).
    """
    prepare_torch_import(fallback_to_cpu=True)
    # after the probe, as in run_benchmark: this imports torch
    from helpers.comm.allreduce import allreduce_benchmark, allreduce_in_launched_job, launched_by_torchrun

    if launched_by_torchrun():
        out = allreduce_in_launched_job(backend=backend, min_bytes=min_bytes, max_size_mib=max_size_mib,
                                        repeats=repeats, warmup=warmup)
        return None if out is None else json.dumps(out, indent=2)
    from helpers.device import get_accelerator

    kind = get_accelerator(device).kind
    before = machine.snapshot()
    out = allreduce_benchmark(backend=backend, world_size=world_size, min_bytes=min_bytes,
                              max_size_mib=max_size_mib, repeats=repeats, warmup=warmup, timeout_s=timeout_s,
                              master_port=master_port, device_kind=kind)
    out.update(_machine_keys(before))
    return json.dumps(out, indent=2)


BENCHMARKS = {"input-pipeline": input_pipeline}


def run_benchmark(name: str, **kwargs) -> str:
    """Run benchmark ``name`` and return its result as a JSON string."""
    return json.dumps(BENCHMARKS[name](**kwargs), indent=2, default=str)
