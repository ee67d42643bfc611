"""Read the profiler traces a user already has: torch.profiler's Kineto JSON, torch_npu's profiler folders,
and folders of them, one per rank (``python -m helpers trace PATH``)."""
