"""Notebook 05's technique in plain PyTorch: copy batch k+1 to the device on a side stream while step k computes.

These three functions are the one source of the side-stream prefetcher as a learner and a user meet it:

- notebook 05's "The change in code" cell shows and runs them as they are here (tests/test_technique_cells.py
  holds the cell to :data:`SOURCE`);
- ``workbook tune`` applies :func:`prefetch` at runtime around a script's DataLoader (:mod:`helpers.tune.hook`,
  ``apply["prefetch"]``) and writes :data:`SOURCE` into the script, with the script's ``for`` loop over the loader
  wrapped in ``prefetch(loader, device)`` (:mod:`helpers.tune.rewrite`, edit kind ``prefetch``).

The workbook's own measurement (notebook 05's experiment) uses :class:`helpers.pipeline.prefetch.DevicePrefetcher`,
the same protocol with every copy timed by device events.

The three safeguards, numbered in the code as in notebook 05 (each one a way such prefetchers go wrong:
huggingface/pytorch-image-models#2781):

1. the step waits for its batch's copy (``Stream.wait_stream``), and only for it: the next copy is queued after;
2. each copied tensor is marked with ``record_stream`` for the step's stream, so that the caching allocator does
   not hand its memory to a later copy while the step still reads it;
3. one side stream per device, made once and reused every epoch (:func:`side_stream` is cached).

Where the device has no streams (a CPU) the batches are copied in order with no side stream; the one-batch
lookahead remains and changes nothing else. ``torch.Stream``, ``Stream.wait_stream`` and
``torch.accelerator.current_stream`` are device-generic (torch >= 2.6) and torch_npu supports them (the fact-check,
``../shared/reference/ascend_api_factcheck.md``). This module imports only torch and the standard library, so the
hook can run it inside a user's process.
"""

from __future__ import annotations

import contextlib
import functools
import inspect

import torch

__all__ = ["HEADER", "IMPORTS", "SOURCE", "copy_batch", "prefetch", "side_stream"]


@functools.cache
def side_stream(device):  # 3. one side stream per device, made once and reused every epoch; None on a CPU
    return None if device.type == "cpu" else torch.Stream(device)


def copy_batch(batch, device, step_stream):  # every tensor of a batch (in tuples, lists, dicts), without blocking
    if isinstance(batch, torch.Tensor):
        out = batch.to(device, non_blocking=True)
        if step_stream is not None:
            out.record_stream(step_stream)  # 2. its memory is kept until the step's kernels are done with it
        return out
    if isinstance(batch, dict):
        return {k: copy_batch(v, device, step_stream) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        items = [copy_batch(v, device, step_stream) for v in batch]
        return type(batch)(*items) if hasattr(batch, "_fields") else type(batch)(items)
    return batch


def prefetch(batches, device):  # the batches on the device, each copied while the step before it computes
    device = torch.device(device)
    side = side_stream(device)
    step_stream = None if side is None else torch.accelerator.current_stream(device)
    queued = []  # the batch whose copy is in flight
    for batch in batches:
        if queued and side is not None:
            step_stream.wait_stream(side)  # 1. the step waits for its batch's copy, not for the next one's
        with side if side is not None else contextlib.nullcontext():  # the copy runs beside the step's kernels
            queued.append(copy_batch(batch, device, step_stream))
        if len(queued) == 2:
            yield queued.pop(0)  # the next batch's copy was queued before this batch's step runs
    if queued and side is not None:
        step_stream.wait_stream(side)
    yield from queued


#: The modules the functions use: tune adds ``import <name>`` where a script lacks it.
IMPORTS = ("contextlib", "functools", "torch")
#: The comment above the functions where tune writes them into a script (and in notebook 05's cell).
HEADER = "# A side-stream prefetcher (the workbook's notebook 05); 1-3 mark its three safeguards.\n"
#: The three functions' source, as notebook 05 shows them and as tune writes them into a script (under
#: :data:`HEADER`, with :data:`IMPORTS`).
SOURCE = HEADER + "\n\n".join(inspect.getsource(f).rstrip("\n") + "\n" for f in (side_stream, copy_batch, prefetch))
