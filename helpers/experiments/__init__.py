"""The experiments layer: one module per notebook experiment, each running on a Job (see docs/architecture.md).

The notebooks, the ``bench`` commands and the tests call the same functions here;
mechanisms (pipeline, compute, comm, diagnose) know nothing of the experiments.
"""
