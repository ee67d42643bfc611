"""The image check cache: a data folder is decoded once, re-checked incrementally, sampled before the check."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

import helpers.pipeline.scan_cache as sc
from helpers.pipeline.dataset import list_image_files, load_dataset

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture()
def cache_dir(tmp_path, monkeypatch) -> Path:
    d = tmp_path / "cache"
    monkeypatch.setenv(sc.CACHE_DIR_ENV, str(d))
    return d


@pytest.fixture()
def decodes(monkeypatch) -> list[Path]:
    """Every file the cache decodes, in order."""
    seen: list[Path] = []
    real = sc.check_image_file

    def counting(path):
        seen.append(Path(path))
        return real(path)

    monkeypatch.setattr(sc, "check_image_file", counting)
    return seen


def _folder(root: Path, n: int, *, bad: int = 0) -> Path:
    for i in range(n):
        cls = "a" if i % 2 else "b"
        p = root / cls / f"{i:04d}.jpg"
        p.parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (24, 16), (i % 256, 40, 90)).save(p, quality=85)
    for i in range(bad):
        (root / "a" / f"broken{i}.jpg").write_bytes(b"not a jpeg at all")
    return root


def test_second_load_decodes_nothing_and_keeps_the_bad_files(tmp_path, cache_dir, decodes):
    root = _folder(tmp_path / "d", 30, bad=2)
    first = load_dataset(root)
    assert len(decodes) == 32 and len(first) == 30 and len(first.skipped) == 2
    decodes.clear()
    second = load_dataset(root)
    assert decodes == []
    assert list(second.paths) == list(first.paths)
    assert sorted(b.reason for b in second.skipped) == sorted(b.reason for b in first.skipped)
    assert first.found == second.found == 32
    assert sc.cache_path(root).is_file() and sc.cache_path(root).parent == cache_dir / "index"


def test_changed_added_and_removed_files_are_reindexed_incrementally(tmp_path, cache_dir, decodes):
    root = _folder(tmp_path / "d", 20)
    load_dataset(root)
    decodes.clear()
    victim = root / "a" / "0001.jpg"
    victim.write_bytes(victim.read_bytes()[:40])  # truncated in place: size and mtime change
    Image.new("RGB", (8, 8)).save(root / "b" / "new.jpg")
    (root / "b" / "0000.jpg").unlink()
    index = load_dataset(root)
    assert sorted(p.name for p in decodes) == ["0001.jpg", "new.jpg"]
    assert [b.path.name for b in index.skipped] == ["0001.jpg"]
    assert len(index) == 19 - 1 + 1
    rows = sc.sqlite3.connect(sc.cache_path(root)).execute("SELECT rel FROM files").fetchall()
    assert "b/0000.jpg" not in {r for (r,) in rows}  # pruned


def test_a_touched_file_is_checked_again(tmp_path, cache_dir, decodes):
    root = _folder(tmp_path / "d", 5)
    load_dataset(root)
    decodes.clear()
    f = root / "a" / "0003.jpg"
    st = f.stat()
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    load_dataset(root)
    assert [p.name for p in decodes] == ["0003.jpg"]


def test_max_images_bounds_the_check_before_the_scan(tmp_path, cache_dir, decodes):
    root = _folder(tmp_path / "d", 200)
    index = load_dataset(root, max_images=10, sample_seed=4)
    assert len(index) == 10 and index.found == 200
    assert len(decodes) == 10  # not 200
    assert list(index.paths) == sorted(index.paths)  # folder order
    again = load_dataset(root, max_images=10, sample_seed=4, use_cache=False)
    assert list(again.paths) == list(index.paths)  # seeded
    other = load_dataset(root, max_images=10, sample_seed=5)
    assert list(other.paths) != list(index.paths)
    assert {b for b in index.labels} == {0, 1}  # the draw is spread over the folder, not its first files


def test_max_images_replaces_bad_draws_with_further_draws(tmp_path, cache_dir, decodes):
    root = _folder(tmp_path / "d", 12, bad=12)
    index = load_dataset(root, max_images=8, sample_seed=0)
    assert len(index) == 8
    assert all("broken" not in p for p in index.paths)
    assert len(decodes) == 8 + len(index.skipped)


def test_max_images_rejects_bad_values(tmp_path, cache_dir):
    root = _folder(tmp_path / "d", 3)
    with pytest.raises(ValueError, match="max_images must be an int >= 0"):
        load_dataset(root, max_images=-1)


def test_cache_off_decodes_everything_and_writes_nothing(tmp_path, cache_dir, decodes):
    root = _folder(tmp_path / "d", 6)
    load_dataset(root, use_cache=False)
    load_dataset(root, use_cache=False)
    assert len(decodes) == 12
    assert not (cache_dir / "index").exists()


def test_unwritable_cache_warns_and_still_checks(tmp_path, monkeypatch, caplog, decodes):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("x")
    monkeypatch.setenv(sc.CACHE_DIR_ENV, str(blocker))
    root = _folder(tmp_path / "d", 4, bad=1)
    index = load_dataset(root)
    assert len(index) == 4 and len(index.skipped) == 1
    assert "checking without a cache" in caplog.text


def test_old_schema_is_rebuilt_not_misread(tmp_path, cache_dir, decodes, monkeypatch):
    root = _folder(tmp_path / "d", 4)
    load_dataset(root)
    decodes.clear()
    monkeypatch.setattr(sc, "SCHEMA_VERSION", sc.SCHEMA_VERSION + 1)
    load_dataset(root)
    assert len(decodes) == 4


def test_paths_outside_the_folder_are_rejected(tmp_path, cache_dir):
    root = _folder(tmp_path / "d", 1)
    other = _folder(tmp_path / "e", 1)
    with pytest.raises(ValueError, match="not inside the data folder"):
        sc.cached_scan(root, list_image_files(other))


def test_listing_skips_hidden_folders_and_non_images(tmp_path):
    root = _folder(tmp_path / "d", 2)
    (root / ".ipynb_checkpoints").mkdir()
    Image.new("RGB", (4, 4)).save(root / ".ipynb_checkpoints" / "x.jpg")
    (root / "a" / "notes.txt").write_text("x")
    Image.new("RGB", (4, 4)).save(root / "a" / "UPPER.JPG")
    names = [p.relative_to(root).as_posix() for p in list_image_files(root)]
    assert names == ["a/0001.jpg", "a/UPPER.JPG", "b/0000.jpg"]


@pytest.mark.slow
def test_two_processes_share_one_check(tmp_path, cache_dir):
    """Two loaders at once (two DDP ranks): the lock makes one decode while the other waits and reuses."""
    root = _folder(tmp_path / "d", 120)
    code = ("import json, sys; from helpers.pipeline.scan_cache import cached_scan; "
            "from helpers.pipeline.dataset import list_image_files; from pathlib import Path; "
            "r = Path(sys.argv[1]); _, st = cached_scan(r, list_image_files(r)); print(json.dumps(st.checked))")
    env = {**os.environ, sc.CACHE_DIR_ENV: str(cache_dir), "PYTHONPATH": str(REPO)}
    procs = [subprocess.Popen([sys.executable, "-c", code, str(root)], stdout=subprocess.PIPE, text=True, env=env)
             for _ in range(2)]
    checked = [json.loads(p.communicate(timeout=120)[0]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert sorted(checked) == [0, 120]


@pytest.fixture()
def unwritable_home(tmp_path, monkeypatch) -> Path:
    """HOME under a regular file (no folder can be made there, even as root); the fallback in a private temp dir."""
    import tempfile

    blocker = tmp_path / "home-is-a-file"
    blocker.write_text("x")
    monkeypatch.setenv("HOME", str(blocker / "home"))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.delenv(sc.CACHE_DIR_ENV, raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(sc, "_LOCATED", {})  # probed afresh, said afresh
    monkeypatch.setattr(sc, "_SAID", set())
    return blocker


def test_an_unwritable_home_moves_the_cache_and_says_where_once(tmp_path, unwritable_home, caplog, decodes):
    root = _folder(tmp_path / "d", 4)
    with caplog.at_level("WARNING", logger=sc.__name__):
        load_dataset(root)
        load_dataset(root)
    said = [r.getMessage() for r in caplog.records if "cache folder" in r.getMessage()]
    fallback = tmp_path / "tmp" / f"training-perf-workbook-cache-{os.getuid()}"
    assert len(said) == 1, said  # once per process, not once per load
    assert f"cannot create the workbook's cache folder '{unwritable_home}/home/" in said[0]  # which folder
    assert "Not a directory" in said[0]  # why
    assert f"the image check and decoded-image caches go to {fallback} instead" in said[0]  # where
    assert f"set {sc.CACHE_DIR_ENV}" in said[0]
    assert "checking without a cache" not in caplog.text
    assert len(decodes) == 4  # the second load was answered from the fallback cache
    assert list((fallback / "index").glob("*.sqlite")) and sc.cache_root() == fallback


def test_an_unwritable_cache_folder_found_by_the_probe_is_said_and_the_runner_prints_it_once(tmp_path, monkeypatch):
    from helpers.errors import OutputDirError
    from helpers.workbook.runner import RunOptions, run

    monkeypatch.delenv(sc.CACHE_DIR_ENV, raising=False)
    monkeypatch.setattr(sc, "_LOCATED", {})
    monkeypatch.setattr(sc, "_SAID", set())
    monkeypatch.setattr(sc.tempfile, "tempdir", str(tmp_path))

    def read_only(path, **kw):  # what a read-only home looks like to the write probe (root is not stopped by chmod)
        raise OutputDirError(f"{kw['what']} {str(path)!r} is not writable: Read-only file system (OSError); ")

    monkeypatch.setattr(sc, "ensure_writable_dir", read_only)
    lines = []
    run(RunOptions(profile="smoke", out=tmp_path / "run", only=["00"]), echo=lines.append,
        executor=lambda nb, **kw: None, device_checker=lambda d: "cpu:test")
    said = [ln for ln in lines if "cache folder" in ln]
    assert len(said) == 1 and said[0].startswith("Cache: the workbook's cache folder ")
    assert "is not writable: Read-only file system" in said[0] and str(tmp_path) in said[0]
    assert sc.cache_fallback_note() is None  # said: neither the runner nor cache_root says it again
