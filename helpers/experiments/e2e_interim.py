"""INTERIM stand-in for the registry's Optimization objects with hooks, until the lead's land on main.

Deleted after ``git merge main``: notebook 10's modules then read helpers.experiments.registry.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from helpers import checklist
from helpers.diagnose.environment import cpu_bf16_support
from helpers.experiments.base import JobPlan, Optimization


def _batched(plan, settings, acc):
    return replace(plan, pipeline="batched")


def _cached(plan, settings, acc):
    return replace(plan, pipeline="cached")


def _workers(plan, settings, acc):
    return replace(plan, num_workers=int(settings["num_workers"]))


def _pinned(plan, settings, acc):
    return replace(plan, pin_memory=bool(acc.capabilities.pinned_memory.available))


def _prefetch(plan, settings, acc):
    return replace(plan, prefetcher=True)


def _amp(plan, settings, acc):
    return replace(plan, options=replace(plan.options, autocast_dtype=getattr(torch, settings["amp_dtype"])))


def _nhwc(plan, settings, acc):
    return replace(plan, options=replace(plan.options, channels_last=True))


def _d_batched(acc, native_bf16=None):
    return True, "batched decode replaces per-image Pillow work on every device"


def _d_cache(acc, native_bf16=None):
    return False, "it writes a decoded copy of the dataset to disk: on only where notebook 02 measured it faster"


def _d_workers(acc, native_bf16=None):
    on = not acc.is_cpu
    return on, ("worker processes feed an accelerator" if on else
                "on a CPU, workers take cores from the training computation")


def _d_pinned(acc, native_bf16=None):
    caps = acc.capabilities
    on = not acc.is_cpu and caps.pinned_memory.available
    return on, ("pinned host buffers speed host-to-device copies" if on
                else f"not available here: {caps.pinned_memory.detail or 'no accelerator'}")


def _d_prefetch(acc, native_bf16=None):
    caps = acc.capabilities
    on = not acc.is_cpu and caps.streams.available
    return on, ("a side-stream copy hides the transfer" if on
                else f"no side streams here: {caps.streams.detail or 'no accelerator'}")


def _d_amp(acc, native_bf16=None):
    dtypes = tuple(acc.capabilities.autocast_dtypes)
    if not dtypes:
        return False, f"{acc.kind} has no autocast dtype"
    if acc.is_cpu:
        if native_bf16 is None:
            native_bf16 = bool(cpu_bf16_support()["native_bf16"])
        return (bool(native_bf16) and "bfloat16" in dtypes,
                "this CPU has native bf16 (AVX512-BF16/AMX/Arm BF16)" if native_bf16 else
                "this CPU has no native bf16: emulated bf16 is slower than fp32")
    return True, f"{acc.kind} autocasts to {', '.join(dtypes)}"


def _d_nhwc(acc, native_bf16=None):
    caps = acc.capabilities
    if acc.kind == "npu":
        return False, "NPU kernels want NCHW: channels_last must not be used there"
    if caps.channels_last.available:
        return True, "the conv encoder runs NHWC kernels on this device"
    return False, f"channels_last unavailable: {caps.channels_last.detail}"


_HOOKS = {"batched_decode": (_batched, _d_batched, ""), "dataset_cache": (_cached, _d_cache, ""),
          "dataloader_workers": (_workers, _d_workers, "num_workers"), "pinned_memory": (_pinned, _d_pinned, ""),
          "prefetcher": (_prefetch, _d_prefetch, ""), "mixed_precision": (_amp, _d_amp, "amp_dtype"),
          "channels_last": (_nhwc, _d_nhwc, "")}

_ALL = tuple(Optimization(name=o.name, notebook=o.notebook, acts_on=o.acts_on, decision=o.decision,
                          requires=o.requires, setting=_HOOKS[o.name][2], default=_HOOKS[o.name][1],
                          apply=_HOOKS[o.name][0]) for o in checklist.OPTIMIZATIONS)


def optimizations():
    return _ALL


def optimization(name):
    return {o.name: o for o in _ALL}[name]


assert JobPlan  # noqa
