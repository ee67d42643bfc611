"""The checklist's changes as code: a diff of a plain PyTorch training loop, written by tune's own rewriter.

Notebook 10 and the run report end with "the change in your code". For the built-in job that is the diff between
its baseline and its optimized variant, shown on the loop every PyTorch user writes (:data:`LOOP`): the edits are
the ones :mod:`helpers.tune.rewrite` makes in a user's script, so the lines a learner reads here are the lines
``workbook tune`` writes; on a device with streams, the side-stream prefetcher is notebook 05's own functions added
to the file, with the loop over the loader wrapped (on a CPU it is only named: it would change nothing there).
Changes to the built-in job's own pipeline (batched decode, the decoded-dataset cache) are named with the notebook
whose "The change in code" cell shows them.
"""

from __future__ import annotations

import textwrap
from typing import Sequence

from helpers.tune.rewrite import Edit, apply_edits, unified_diff

__all__ = ["LOOP", "change_as_code"]

#: The training loop the diff is shown on: a DataLoader, a model, an optimizer, the copy, the forward, the step.
LOOP = textwrap.dedent('''\
    import torch
    from torch.utils.data import DataLoader

    loader = DataLoader(dataset, batch_size=batch_size, shuffle=True)
    model = Model().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for images, labels in loader:
        images, labels = images.to(device), labels.to(device)
        logits = model(images)
        loss = criterion(logits, labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    ''')
#: Lines of :data:`LOOP` where each kind of edit goes.
_LINE = {"loader": 4, "optimizer": 6, "loop": 7, "copy": 8, "forward": 9}
#: Optimizations that are not an edit of the loop: where their code is shown.
_ELSEWHERE = {
    "batched_decode": "decode each batch at once on a thread pool: notebook 02's 'The change in code' cell",
    "dataset_cache": "decode the dataset once and keep it: notebook 02",
}


def change_as_code(optimizations: Sequence[str], *, num_workers: int = 2, amp_dtype: str = "bfloat16",
                   device_type: str = "cpu", path: str = "train.py") -> tuple[str, list[str]]:
    """The diff of :data:`LOOP` that applies ``optimizations``, and a note for each one it cannot show as an edit.

    Parameters
    ----------
    optimizations : sequence of str
        Notebook 10's optimization names (:class:`helpers.experiments.e2e_jobs.JobConfig`): ``dataloader_workers``,
        ``pinned_memory``, ``mixed_precision``, ``channels_last``, ``prefetcher``, ``batched_decode``,
        ``dataset_cache``; others are named in a note.
    num_workers : int
        The DataLoader's workers with ``dataloader_workers``.
    amp_dtype : str
        ``"bfloat16"`` or ``"float16"`` with ``mixed_precision``.
    device_type : str
        ``torch.autocast``'s ``device_type``: ``"cpu"``, ``"cuda"`` or ``"npu"``.
    path : str
        The file name the diff's header names.

    Returns
    -------
    (str, list of str)
        The unified diff ("" when no optimization edits the loop) and the notes.
    """
    opts = set(optimizations)
    loader: dict[str, object] = {}
    edits: list[Edit] = []
    notes: list[str] = []
    if "dataloader_workers" in opts:
        loader.update(num_workers=int(num_workers), persistent_workers=True)
    if "pinned_memory" in opts:
        loader["pin_memory"] = True
        edits.append(Edit("non_blocking", path, _LINE["copy"], {}, "pin_memory"))
        if device_type == "cpu":
            notes.append("pinned memory and non_blocking copies act only where a device (CUDA, NPU) is fed")
    if loader:
        edits.append(Edit("loader", path, _LINE["loader"], loader, "num_workers"))
    if "mixed_precision" in opts:
        edits.append(Edit("autocast", path, _LINE["forward"], {"device_type": device_type, "dtype": amp_dtype},
                          "autocast"))
        if amp_dtype == "float16":
            notes.append("float16 also needs a torch.amp.GradScaler around backward() and step(): notebook 06 shows "
                         "it")
    if "channels_last" in opts:
        edits.append(Edit("channels_last", path, _LINE["optimizer"], {"name": "model"}, "channels_last"))
    if "prefetcher" in opts and device_type == "cpu":  # no stream: notebook 05's functions would change nothing
        notes.append("the side-stream prefetcher (notebook 05's 'The change in code') overlaps copies only where the "
                     "device has streams (CUDA, NPU): on a CPU it changes nothing, so it is not in the diff")
    elif "prefetcher" in opts:
        edits.append(Edit("prefetch", path, _LINE["loop"], {"device": "device"}, "side_stream"))
    for name in optimizations:
        if name in _ELSEWHERE:
            notes.append(_ELSEWHERE[name])
        elif name not in ("dataloader_workers", "pinned_memory", "mixed_precision", "channels_last", "prefetcher"):
            notes.append(f"{name}: see its notebook")
    if not edits:
        return "", notes
    new, _, skipped = apply_edits(LOOP, edits)
    assert not skipped, skipped  # the loop is ours: every edit has its line
    return unified_diff(LOOP, new, path), notes
