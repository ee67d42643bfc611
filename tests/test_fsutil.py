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


def test_write_atomic_replaces_the_file_whole_with_the_usual_permissions(tmp_path):
    import os
    import stat

    from helpers.fsutil import write_atomic

    target = tmp_path / "report.md"
    assert write_atomic(target, "first\n") == target and target.read_text() == "first\n"
    write_atomic(target, b"\x00second")
    assert target.read_bytes() == b"\x00second"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.md"]  # no temporary file left
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~umask  # as open(path, "w") makes it, not mkstemp's 0600


@pytest.mark.parametrize("fails", ["write", "fsync", "replace"])
def test_write_atomic_on_a_full_disk_keeps_the_old_file_and_removes_its_temporary(tmp_path, monkeypatch, fails):
    import errno
    import io
    import os

    from helpers import fsutil

    target = tmp_path / "run.json"
    target.write_text('{"status": "running"}')

    def enospc(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    if fails == "write":  # the temporary file exists (0 bytes) when its first write fails
        real_fdopen = os.fdopen

        class Full(io.RawIOBase):
            def __init__(self, fh):
                self.fh = fh

            def write(self, data):
                enospc()

            def fileno(self):
                return self.fh.fileno()

            def close(self):
                self.fh.close()
                super().close()

        monkeypatch.setattr(os, "fdopen", lambda fd, *a, **k: Full(real_fdopen(fd, *a, **k)))
    else:
        monkeypatch.setattr(os, fails, enospc)
    with pytest.raises(OSError) as caught:
        fsutil.write_atomic(target, '{"status": "failed"}')
    assert caught.value.errno == errno.ENOSPC
    monkeypatch.undo()
    assert target.read_text() == '{"status": "running"}'  # never truncated
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.json"]
