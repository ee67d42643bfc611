"""Writable-folder checks."""

import pytest

from helpers.errors import OutputDirError
from helpers.fsutil import ensure_writable_dir


def test_creates_nested_folder(tmp_path):
    out = ensure_writable_dir(tmp_path / "a" / "b")
    assert out.is_dir() and not list(out.iterdir())  # the probe file is removed


def test_path_through_a_file_is_refused_with_the_hint(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(OutputDirError, match="cannot create run folder.*pass --out"):
        ensure_writable_dir(tmp_path / "file" / "sub", what="run folder", hint="pass --out")
    with pytest.raises(OutputDirError, match="exists but is not a folder"):
        ensure_writable_dir(tmp_path / "file")
