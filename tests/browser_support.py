"""Finding the system Chromium for the browser tests (tests/test_report_browser.py, tests/test_lab_browser.py).

Chromium missing: a test fails with the install command when WORKBOOK_REQUIRE_BROWSER=1 (set by .ci/run), and is
skipped otherwise.
"""

from __future__ import annotations

import os
import shutil

import pytest

INSTALL = "sudo apt-get install -y --no-install-recommends chromium   (or: make browser, as root)"


def chromium() -> str:
    """The path of the system Chromium; fails (CI) or skips (elsewhere) the calling test when there is none."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    message = f"Chromium is not installed; the browser tests need it: {INSTALL}"
    if os.environ.get("WORKBOOK_REQUIRE_BROWSER") == "1":
        pytest.fail(message)
    pytest.skip(message)
