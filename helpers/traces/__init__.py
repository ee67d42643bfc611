"""Read the profiler traces a user already has: torch.profiler's Kineto JSON, torch_npu's profiler folders,
and folders of them, one per rank (``python -m helpers trace PATH``).

``read(paths)`` (:func:`helpers.traces.cluster.read`) finds the traces among files and folders, checks from their
metadata that they are the ranks of one run, and returns one :class:`~helpers.traces.model.RankTrace` per rank.
"""

from helpers.traces.cluster import TraceSet, find_traces, read

__all__ = ["TraceSet", "find_traces", "read"]
