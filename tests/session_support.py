"""What a fixture can ask of the test session, shared by tests/conftest.py and the test files."""

from __future__ import annotations

import pytest


def session_uses(request: pytest.FixtureRequest, fixture: str) -> bool:
    """Whether any test selected in this session asks for ``fixture`` (so that it is made anyway)."""
    return any(fixture in getattr(item, "fixturenames", ()) for item in request.session.items)
