"""Tests of the embedded dataset builder and of user-folder indexing."""

from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from helpers.errors import DataError, OutputDirError, ParameterError
from helpers.pipeline import dataset as ds
from helpers.pipeline.dataset import (
    EMBEDDED_SOURCES,
    DatasetIndex,
    build_embedded,
    default_data_root,
    ensure_embedded,
    load_dataset,
)

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "data" / "fixtures"
N_SMALL = 12


@pytest.fixture(scope="module")
def small_build(tmp_path_factory) -> Path:
    return build_embedded(tmp_path_factory.mktemp("emb") / "a", n_images=N_SMALL, seed=3)


def _all_bytes(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _write_jpeg(path: Path, colour=(200, 30, 30), size=(40, 30)) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, colour).save(path, quality=90)
    return path


# ---------------------------------------------------------------- embedded build


def test_sources_are_public_domain_or_cc0_and_bundled():
    import skimage.data

    for src in EMBEDDED_SOURCES:
        lic = src.license.lower()
        assert lic.startswith("public domain") or lic.startswith("cc0"), src
        doc = getattr(skimage.data, src.name).__doc__.lower()
        assert "public domain" in doc or "cc0" in doc, src.name


def test_embedded_manifest_is_consistent(small_build):
    manifest = pd.read_csv(small_build / "manifest.csv")
    assert list(manifest.columns) == ["file", "caption", "label", "source", "width", "height", "quality", "progressive"]
    assert len(manifest) == N_SMALL
    assert sorted(p.name for p in (small_build / "images").iterdir()) == [f"{i:05d}.jpg" for i in range(N_SMALL)]
    for row in manifest.itertuples():
        with Image.open(small_build / row.file) as im:
            assert im.format == "JPEG" and im.mode == "RGB"
            assert im.size == (row.width, row.height)
            assert bool(im.info.get("progressive", 0)) == bool(row.progressive)
        assert 256 <= max(row.width, row.height) <= 1024
        assert 60 <= row.quality <= 95
        assert EMBEDDED_SOURCES[row.label].name == row.source
        assert isinstance(row.caption, str) and 3 <= len(row.caption.split()) <= 20
    # balanced labels: every count within one of the others
    counts = np.bincount(manifest["label"], minlength=len(EMBEDDED_SOURCES))
    assert counts.max() - counts.min() <= 1
    info = json.loads((small_build / "BUILD_INFO.json").read_text())
    assert info["seed"] == 3 and info["n_images"] == N_SMALL and info["builder_version"] == ds.BUILDER_VERSION
    assert [s["name"] for s in info["sources"]] == [s.name for s in EMBEDDED_SOURCES]


def test_grey_sources_become_three_channel_jpegs_with_equal_channels(small_build):
    manifest = pd.read_csv(small_build / "manifest.csv")
    grey = {s.name for s in EMBEDDED_SOURCES if s.grey}
    rows = manifest[manifest["source"].isin(grey)]
    assert len(rows) > 0
    for row in rows.itertuples():
        arr = np.asarray(Image.open(small_build / row.file)).astype(int)
        assert arr.ndim == 3 and arr.shape[2] == 3
        assert np.abs(arr[:, :, 0] - arr[:, :, 1]).mean() < 2  # JPEG chroma of a grey picture is ~0
        assert "black-and-white" in row.caption


def test_embedded_build_is_deterministic(small_build, tmp_path):
    again = build_embedded(tmp_path / "b", n_images=N_SMALL, seed=3)
    assert _all_bytes(again) == _all_bytes(small_build)
    other = build_embedded(tmp_path / "c", n_images=N_SMALL, seed=4)
    assert (other / "images" / "00000.jpg").read_bytes() != (small_build / "images" / "00000.jpg").read_bytes()


def test_build_refuses_a_non_empty_folder(tmp_path):
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "keep.txt").write_text("mine")
    with pytest.raises(OutputDirError, match="not an empty folder"):
        build_embedded(tmp_path / "x", n_images=2)


@pytest.mark.parametrize("kwargs", [{"n_images": 0}, {"n_images": 2.5}, {"n_images": True}, {"seed": -1}])
def test_build_rejects_bad_arguments(tmp_path, kwargs):
    with pytest.raises(ParameterError):
        build_embedded(tmp_path / "x", **{"n_images": 2, **kwargs})


def test_default_data_root(monkeypatch, tmp_path):
    monkeypatch.delenv("WORKBOOK_DATA_DIR", raising=False)
    assert default_data_root() == REPO / "data" / "generated"
    monkeypatch.setenv("WORKBOOK_DATA_DIR", str(tmp_path / "elsewhere"))
    assert default_data_root() == tmp_path / "elsewhere"
    monkeypatch.setenv("WORKBOOK_DATA_DIR", "  ")
    assert default_data_root() == REPO / "data" / "generated"


def test_ensure_embedded_builds_once_then_reuses(tmp_path, monkeypatch):
    folder = ensure_embedded(n_images=4, seed=1, root=tmp_path)
    assert folder.parent == tmp_path and (folder / "BUILD_INFO.json").is_file()
    stamp = (folder / "BUILD_INFO.json").stat().st_mtime_ns

    def no_build(*args, **kwargs):
        raise AssertionError("rebuilt a current dataset")

    monkeypatch.setattr(ds, "build_embedded", no_build)
    assert ensure_embedded(n_images=4, seed=1, root=tmp_path) == folder
    assert (folder / "BUILD_INFO.json").stat().st_mtime_ns == stamp


def test_ensure_embedded_rebuilds_a_stale_or_broken_folder(tmp_path):
    folder = ensure_embedded(n_images=3, seed=0, root=tmp_path)
    info = json.loads((folder / "BUILD_INFO.json").read_text())
    info["builder_version"] = -1
    (folder / "BUILD_INFO.json").write_text(json.dumps(info))
    (folder / "junk.txt").write_text("left by an old build")
    assert ensure_embedded(n_images=3, seed=0, root=tmp_path) == folder
    assert json.loads((folder / "BUILD_INFO.json").read_text())["builder_version"] == ds.BUILDER_VERSION
    assert not (folder / "junk.txt").exists()
    (folder / "BUILD_INFO.json").unlink()  # an interrupted build
    ensure_embedded(n_images=3, seed=0, root=tmp_path)
    assert (folder / "BUILD_INFO.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == [folder.name]  # no temporary folders left


def test_ensure_embedded_survives_a_race(tmp_path):
    results, errors = [], []

    def worker():
        try:
            results.append(ensure_embedded(n_images=3, seed=2, root=tmp_path))
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(set(results)) == 1
    folder = results[0]
    assert len(list((folder / "images").iterdir())) == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == [folder.name]


def test_load_dataset_none_uses_the_embedded_dataset(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBOOK_DATA_DIR", str(tmp_path))
    index = load_dataset(None, n_images=5, seed=0)
    same = load_dataset("", n_images=5, seed=0, scan=False)
    assert len(index) == 5 and index.root == tmp_path / "embedded-n5-seed0"
    assert np.array_equal(index.paths, same.paths)
    assert index.n_classes == len(EMBEDDED_SOURCES)
    assert index.class_names == tuple(s.name for s in EMBEDDED_SOURCES)


def test_index_of_an_embedded_folder(small_build):
    index = load_dataset(small_build)
    manifest = pd.read_csv(small_build / "manifest.csv")
    assert isinstance(index, DatasetIndex) and len(index) == N_SMALL and index.skipped == ()
    assert index.paths.dtype.kind == "U" and index.captions.dtype.kind == "U"
    assert index.labels.dtype == np.int64
    assert index.captions.tolist() == manifest["caption"].tolist()
    assert index.labels.tolist() == manifest["label"].tolist()
    assert [Path(p).name for p in index.paths] == [Path(f).name for f in manifest["file"]]
    frame = index.frame()
    assert list(frame.columns) == ["path", "caption", "label"] and len(frame) == N_SMALL


# ---------------------------------------------------------------- user folders


def test_user_folder_with_captions_csv_and_bad_files(tmp_path, caplog):
    _write_jpeg(tmp_path / "b.jpg")
    _write_jpeg(tmp_path / "a.jpg")
    _write_jpeg(tmp_path / "sub" / "c.jpg")
    for name in ("truncated.jpg", "zero_bytes.jpg", "not_an_image.jpg"):
        shutil.copy(FIXTURES / name, tmp_path / name)
    (tmp_path / "captions.csv").write_text(
        "file,caption\na.jpg,A red square\nsub/c.jpg,another square\nmissing.jpg,nobody\n", encoding="utf-8"
    )
    index = load_dataset(tmp_path)
    names = [Path(p).relative_to(tmp_path).as_posix() for p in index.paths]
    assert names == ["a.jpg", "b.jpg", "sub/c.jpg"]  # sorted; bad files dropped
    assert index.captions.tolist() == ["A red square", "b", "another square"]
    reasons = {b.path.name: b.reason for b in index.skipped}
    assert reasons["truncated.jpg"].startswith("truncated JPEG")
    assert reasons["zero_bytes.jpg"] == "zero-byte file"
    assert reasons["not_an_image.jpg"].startswith("not an image")
    # no label column -> class from the top-level subfolder ("" for top-level files)
    assert index.labels.tolist() == [0, 0, 1] and index.class_names == ("", "sub") and index.n_classes == 2
    assert "missing.jpg" in caplog.text


def test_user_folder_labels_from_captions_csv(tmp_path):
    for name in ("x.jpg", "y.jpg", "z.jpg", "unlisted.jpg"):
        _write_jpeg(tmp_path / name)
    (tmp_path / "captions.csv").write_text("file,caption,label\nx.jpg,ex,3\ny.jpg,why,0\nz.jpg,zed,3\n")
    index = load_dataset(tmp_path)
    assert [Path(p).name for p in index.paths] == ["x.jpg", "y.jpg", "z.jpg"]
    assert index.labels.tolist() == [3, 0, 3] and index.n_classes == 4
    assert [(b.path.name, b.reason.startswith("no label")) for b in index.skipped] == [("unlisted.jpg", True)]


def test_user_folder_class_names_from_captions_file_and_jsonl(tmp_path):
    for name in ("p.jpg", "q.jpg", "r.jpg"):
        _write_jpeg(tmp_path / name)
    lines = [{"file": "p.jpg", "caption": "pea", "label": "veg"}, {"file": "q.jpg", "caption": "queue", "label": "abc"},
             {"file": "r.jpg", "caption": "arr", "label": "veg"}]
    (tmp_path / "captions.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    index = load_dataset(tmp_path)
    assert index.captions.tolist() == ["pea", "queue", "arr"]
    assert index.class_names == ("abc", "veg") and index.labels.tolist() == [1, 0, 1]


def test_user_folder_class_subfolders_sidecars_and_stem_captions(tmp_path):
    _write_jpeg(tmp_path / "dogs" / "Golden_Retriever-01.jpg")
    _write_jpeg(tmp_path / "cats" / "tabby.png")
    _write_jpeg(tmp_path / "cats" / "deep" / "IMG_0042.JPG")
    (tmp_path / "cats" / "tabby.txt").write_text("  a tabby\ncat on a mat \n")
    _write_jpeg(tmp_path / ".ipynb_checkpoints" / "hidden.jpg")
    (tmp_path / "notes.md").write_text("not an image")
    index = load_dataset(tmp_path)
    names = [Path(p).relative_to(tmp_path).as_posix() for p in index.paths]
    assert names == ["cats/deep/IMG_0042.JPG", "cats/tabby.png", "dogs/Golden_Retriever-01.jpg"]
    assert index.captions.tolist() == ["cats deep img 0042", "a tabby cat on a mat", "dogs golden retriever 01"]
    assert index.labels.tolist() == [0, 0, 1] and index.class_names == ("cats", "dogs")


def test_flat_folder_without_captions_has_one_class(tmp_path):
    _write_jpeg(tmp_path / "one.jpg")
    _write_jpeg(tmp_path / "two.jpg")
    index = load_dataset(tmp_path, scan=False)
    assert index.labels.tolist() == [0, 0] and index.n_classes == 1


# ---------------------------------------------------------------- errors


def test_missing_folder(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        load_dataset(tmp_path / "nowhere")


def test_path_is_a_file(tmp_path):
    _write_jpeg(tmp_path / "a.jpg")
    with pytest.raises(DataError, match="is not a folder"):
        load_dataset(tmp_path / "a.jpg")


def test_folder_without_images_says_which_suffixes(tmp_path):
    (tmp_path / "readme.txt").write_text("hello")
    with pytest.raises(DataError, match=r"no image files.*\.jpg.*\.webp"):
        load_dataset(tmp_path)


def test_folder_without_decodable_image_lists_reasons(tmp_path):
    shutil.copy(FIXTURES / "truncated.jpg", tmp_path / "t.jpg")
    shutil.copy(FIXTURES / "zero_bytes.jpg", tmp_path / "z.jpg")
    with pytest.raises(DataError, match=r"no decodable image.*t\.jpg: truncated JPEG.*z\.jpg: zero-byte file"):
        load_dataset(tmp_path)


def test_captions_csv_without_required_columns(tmp_path):
    _write_jpeg(tmp_path / "a.jpg")
    (tmp_path / "captions.csv").write_text("name,text\na.jpg,hello\n")
    with pytest.raises(DataError, match="lacks column"):
        load_dataset(tmp_path)


def test_captions_jsonl_with_a_bad_line(tmp_path):
    _write_jpeg(tmp_path / "a.jpg")
    (tmp_path / "captions.jsonl").write_text('{"file": "a.jpg", "caption": "ok"}\n{not json\n')
    with pytest.raises(DataError, match="line 2"):
        load_dataset(tmp_path)


def test_partly_empty_label_column(tmp_path):
    _write_jpeg(tmp_path / "a.jpg")
    _write_jpeg(tmp_path / "b.jpg")
    (tmp_path / "captions.csv").write_text("file,caption,label\na.jpg,x,1\nb.jpg,y,\n")
    with pytest.raises(DataError, match="label is empty"):
        load_dataset(tmp_path)


def test_ensure_embedded_rebuilds_a_damaged_copy(tmp_path):
    folder = ensure_embedded(n_images=3, seed=0, root=tmp_path)
    first = (folder / "images" / "00001.jpg").read_bytes()
    (folder / "images" / "00000.jpg").unlink()
    (folder / "images" / "00001.jpg").write_bytes(first[: len(first) // 2])
    assert ensure_embedded(n_images=3, seed=0, root=tmp_path) == folder
    assert (folder / "images" / "00000.jpg").is_file()
    assert (folder / "images" / "00001.jpg").read_bytes() == first


def test_check_batch_fits(small_build):
    from helpers.pipeline.dataset import check_batch_fits, load_dataset

    index = load_dataset(small_build)
    check_batch_fits(index, len(index))
    with pytest.raises(DataError, match=rf"{len(index)} usable image\(s\), fewer than batch_size={len(index) + 1}: "
                                        "lower batch_size"):
        check_batch_fits(index, len(index) + 1)


def test_captions_rows_outside_the_folder_are_ignored_and_said_as_such(tmp_path, caplog):
    root = tmp_path / "data"
    _write_jpeg(root / "a.jpg")
    _write_jpeg(root / "b.jpg")
    _write_jpeg(tmp_path / "elsewhere" / "x.jpg")  # exists, but outside the data folder
    (root / "captions.csv").write_text(
        "file,caption\na.jpg,A\n../elsewhere/x.jpg,escapes\n" f"{tmp_path / 'elsewhere' / 'x.jpg'},absolute\n"
        "sub/../../x.jpg,also escapes\nmissing.jpg,nobody\n", encoding="utf-8")
    with caplog.at_level("WARNING", logger="helpers.pipeline.dataset"):
        index = load_dataset(root)
    assert [Path(p).name for p in index.paths] == ["a.jpg", "b.jpg"]  # nothing outside is read
    assert index.captions.tolist() == ["A", "b"]
    outside = next(r.getMessage() for r in caplog.records if "outside the folder" in r.getMessage())
    assert f"captions.csv lists 3 file(s) outside the folder {root.resolve()}, ignored" in outside
    assert "../elsewhere/x.jpg" in outside and "missing.jpg" not in outside
    missing = next(r.getMessage() for r in caplog.records if "not found as images" in r.getMessage())
    assert "lists 1 file(s) not found" in missing and "missing.jpg" in missing and "elsewhere" not in missing


def test_a_labelled_row_outside_the_folder_does_not_count_as_a_label(tmp_path):
    _write_jpeg(tmp_path / "a.jpg")
    (tmp_path / "captions.csv").write_text("file,caption,label\na.jpg,in,1\n../a.jpg,out,\n", encoding="utf-8")
    index = load_dataset(tmp_path)  # the empty label of the ignored row is no error
    assert [Path(p).name for p in index.paths] == ["a.jpg"] and index.labels.tolist() == [1]
    (tmp_path / "captions.csv").write_text("file,caption,label\n../a.jpg,out,7\n", encoding="utf-8")
    index = load_dataset(tmp_path)  # nor does its label make a.jpg "not listed in a file that gives labels"
    assert [Path(p).name for p in index.paths] == ["a.jpg"] and not index.skipped
