"""Helpers for the training-performance workbook.

Layers (arrows point one way; nothing imports a layer above it)::

    notebooks -> workbook -> (pipeline, compute, comm, diagnose)
              -> (device, timing, results, params, errors)

Nothing here does work at import time, and nothing outside ``workbook``
imports matplotlib or ipywidgets, so the package runs headless and inside
DataLoader worker processes.
"""

__version__ = "0.1.0"
