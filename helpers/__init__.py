"""Helpers for the training-performance workbook.

Layers (arrows point one way; nothing imports a layer above it; tests/test_layers.py keeps it so, and
docs/architecture.md draws it)::

    notebooks -> workbook -> experiments -> jobs -> (pipeline, compute, comm, diagnose)
              -> (device, timing, results, verdict, checklist, specs, params, errors, ...)

Nothing here does work at import time, and nothing outside ``workbook``
imports matplotlib or ipywidgets, so the package runs headless and inside
DataLoader worker processes.
"""

__version__ = "0.1.0"
