"""The experiments layer: one module per notebook experiment and its verdict (see docs/architecture.md).

An experiment that trains takes a Job (:mod:`helpers.jobs`); one that measures a mechanism alone (decode,
the loader sweep, pinned copies, collectives) takes its inputs. Each module offers the same small surface:
run it, its ``verdict()`` (a :class:`helpers.verdict.Verdict`), its records. The notebooks, the ``bench``
commands and the tests call the same functions; the mechanisms (pipeline, compute, comm, diagnose) know
nothing of the experiments.
"""
