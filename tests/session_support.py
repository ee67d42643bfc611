"""What a fixture can ask of the test session, shared by tests/conftest.py and the test files."""

from __future__ import annotations

import os

import pytest


def session_uses(request: pytest.FixtureRequest, fixture: str) -> bool:
    """Whether any test selected in this session asks for ``fixture`` (so that it is made anyway)."""
    return any(fixture in getattr(item, "fixturenames", ()) for item in request.session.items)


def smoke_run_if_made(request, tmp_path_factory):
    """tests/conftest.py's ``smoke_run`` (``(run_dir, state)``) for a test that can reuse it but must not wait for
    it: under pytest-xdist only once a worker has finished it (its ``smoke.done`` marker, see ``shared_run``; else
    None, and the test measures for itself); in one process whenever the session asks for it anyway (made now if no
    test made it yet). None when no selected test uses it."""
    if not session_uses(request, "smoke_run"):
        return None
    if os.environ.get("PYTEST_XDIST_WORKER") and not (tmp_path_factory.getbasetemp().parent / "smoke.done").exists():
        return None
    return request.getfixturevalue("smoke_run")
