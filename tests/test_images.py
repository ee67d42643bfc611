"""Tests of the reference decode, the scan, and the committed fixtures."""

from __future__ import annotations

import importlib.util
import json
import logging
import pickle
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageFile

from helpers.errors import DataError, ParameterError
from helpers.pipeline.images import IMAGE_SUFFIXES, BadImage, ScanReport, load_rgb, scan_images, to_rgb_array

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "data" / "fixtures"
EXPECTED = json.loads((FIXTURES / "expected.json").read_text(encoding="utf-8"))["files"]
GOOD = sorted(n for n, e in EXPECTED.items() if e["decodes"])
BAD = sorted(n for n, e in EXPECTED.items() if not e["decodes"])

# Pure colour squares of the colour fixtures (see data/make_fixtures.py): centre pixel of each.
RED_AT, GREEN_AT, BLUE_AT = (8, 8), (8, -8), (-8, 8)
COLOUR_FIXTURES = ["rgb_patches.png", "rgb_patches.jpg", "progressive.jpg", "cmyk.jpg",
                   "exif_orientation6.jpg", "exif_orientation8.jpg", "palette.png", "rgb16.png"]


def _load_make_fixtures():
    spec = importlib.util.spec_from_file_location("make_fixtures", REPO / "data" / "make_fixtures.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _save(tmp_path: Path, im: Image.Image, name: str) -> Path:
    path = tmp_path / name
    im.save(path)
    return path


# ---------------------------------------------------------------- fixtures decode as expected.json says


@pytest.mark.parametrize("name", GOOD)
def test_good_fixture_decodes_to_expected_shape_and_pixels(name):
    entry = EXPECTED[name]
    rgb = load_rgb(FIXTURES / name)
    assert rgb.dtype == np.uint8
    assert rgb.shape == (entry["height"], entry["width"], 3)
    assert rgb.flags.c_contiguous and rgb.flags.writeable
    if entry["reference"]:
        ref = load_rgb(FIXTURES / entry["reference"]).astype(np.int16)
        err = np.abs(rgb.astype(np.int16) - ref)
        assert err.mean() <= entry["max_mean_abs_error"], f"{name}: mean abs error {err.mean():.2f}"
        assert err.max() <= entry["max_abs_error"], f"{name}: max abs error {err.max()}"


@pytest.mark.parametrize("name", BAD)
def test_bad_fixture_is_rejected_with_its_reason(name):
    with pytest.raises(BadImage) as info:
        load_rgb(FIXTURES / name)
    assert info.value.reason.startswith(EXPECTED[name]["reason"])
    assert info.value.path == FIXTURES / name
    assert isinstance(info.value, DataError)
    assert name in str(info.value)


@pytest.mark.parametrize("name", COLOUR_FIXTURES)
def test_channel_order_is_rgb(name):
    rgb = load_rgb(FIXTURES / name).astype(int)
    for (y, x), channel in ((RED_AT, 0), (GREEN_AT, 1), (BLUE_AT, 2)):
        px = rgb[y, x]
        assert px[channel] > 200, f"{name}: channel {channel} at {(y, x)} is {px}"
        assert all(px[c] < 60 for c in range(3) if c != channel), f"{name}: {px} at {(y, x)}"


@pytest.mark.parametrize("name,tag", [("exif_orientation6.jpg", 6), ("exif_orientation8.jpg", 8)])
def test_exif_rotation_is_restored(name, tag):
    with Image.open(FIXTURES / name) as im:
        assert im.getexif()[0x0112] == tag
        stored = np.asarray(im.convert("RGB"))
    upright = load_rgb(FIXTURES / name)
    assert stored.shape[:2] == upright.shape[:2][::-1]  # the fixture really is stored rotated
    ref = load_rgb(FIXTURES / "rgb_patches.png").astype(int)
    assert np.abs(upright.astype(int) - ref).mean() < 6


def test_cmyk_fixture_is_cmyk_and_colours_match_source():
    with Image.open(FIXTURES / "cmyk.jpg") as im:
        assert im.mode == "CMYK"
    got = load_rgb(FIXTURES / "cmyk.jpg").astype(int)
    src = load_rgb(FIXTURES / "rgb_patches.png").astype(int)
    err = np.abs(got - src)
    assert err.mean() < 4.0
    # Per-channel means agree too (an un-inverted CMYK would give the negative picture).
    assert np.all(np.abs(got.mean(axis=(0, 1)) - src.mean(axis=(0, 1))) < 3.0)


def test_16_bit_grey_is_scaled_not_clipped():
    with Image.open(FIXTURES / "grey16.png") as im:
        assert im.mode == "I;16"
        raw = np.asarray(im).astype(np.int64)
    assert raw.max() > 255  # clipping would show
    got = load_rgb(FIXTURES / "grey16.png")
    ref = np.asarray(Image.open(FIXTURES / "grey8.png"))
    assert np.array_equal(got[:, :, 0], ref) and np.array_equal(got[:, :, 1], ref) and np.array_equal(got[:, :, 2], ref)
    assert np.array_equal(got[:, :, 0], (raw >> 8).astype(np.uint8))
    clipped = np.clip(raw, 0, 255).astype(np.uint8)  # what a clipping conversion gives
    assert np.abs(clipped.astype(int) - ref.astype(int)).mean() > 50


def test_16_bit_rgb_png_keeps_the_high_byte():
    got = load_rgb(FIXTURES / "rgb16.png")
    assert np.array_equal(got, load_rgb(FIXTURES / "rgb_patches.png"))


def test_grey_is_replicated_into_three_equal_channels():
    got = load_rgb(FIXTURES / "grey8.png")
    ref = np.asarray(Image.open(FIXTURES / "grey8.png"))
    for c in range(3):
        assert np.array_equal(got[:, :, c], ref)


def test_alpha_is_composited_on_white():
    got = load_rgb(FIXTURES / "rgba.png")
    assert np.all(got[:, 48:] == 255)  # fully transparent columns
    opaque = np.asarray(Image.open(FIXTURES / "rgba.png"))[:, :32, :3]
    assert np.array_equal(got[:, :32], opaque)


def test_fixtures_are_small():
    for path in FIXTURES.iterdir():
        assert path.stat().st_size < 30_000, path


# ---------------------------------------------------------------- other modes, made in memory


def test_palette_with_transparency_is_composited_on_white(tmp_path):
    im = Image.new("P", (8, 4), 0)
    im.putpalette([255, 0, 0, 0, 0, 255] + [0] * 762)
    im.paste(1, (4, 0, 8, 4))
    im.info["transparency"] = 1
    path = tmp_path / "p.png"
    im.save(path, transparency=1)
    got = load_rgb(path)
    assert np.all(got[:, :4] == (255, 0, 0))
    assert np.all(got[:, 4:] == 255)


def test_bilevel_image_becomes_black_and_white_rgb(tmp_path):
    im = Image.new("1", (6, 2), 0)
    im.paste(1, (3, 0, 6, 2))
    got = load_rgb(_save(tmp_path, im, "b.png"))
    assert np.all(got[:, :3] == 0) and np.all(got[:, 3:] == 255)


def test_mode_i_in_16_bit_range_is_scaled(tmp_path):
    im = Image.fromarray(np.array([[0, 256, 65535, 4096]], dtype=np.int32), "I")
    path = _save(tmp_path, im, "i.tif")
    with Image.open(path) as check:
        assert check.mode == "I"
    assert load_rgb(path)[0, :, 0].tolist() == [0, 1, 255, 16]


def test_mode_i_out_of_16_bit_range_is_rejected(tmp_path):
    im = Image.fromarray(np.array([[-5, 70000]], dtype=np.int32), "I")
    with pytest.raises(BadImage, match="unsupported mode I"):
        load_rgb(_save(tmp_path, im, "i.tif"))


def test_big_endian_16_bit_is_scaled():
    im = Image.fromarray(np.array([[0x1234, 0xFF00]], dtype=">u2"))
    assert im.mode == "I;16B"
    assert to_rgb_array(im)[0, :, 1].tolist() == [0x12, 0xFF]


def test_unsupported_modes_are_rejected_and_hsv_converted():
    with pytest.raises(BadImage, match="unsupported mode LAB"):
        to_rgb_array(Image.new("LAB", (2, 2)))
    with pytest.raises(BadImage, match="unsupported mode F"):
        to_rgb_array(Image.new("F", (2, 2)))
    assert to_rgb_array(Image.new("HSV", (2, 2), (0, 255, 255)))[0, 0].tolist() == [255, 0, 0]


def test_missing_file_is_a_bad_image(tmp_path):
    with pytest.raises(BadImage, match="missing file"):
        load_rgb(tmp_path / "nope.jpg")


def test_bad_image_survives_pickling():
    err = BadImage("/x/y.jpg", "zero-byte file")
    back = pickle.loads(pickle.dumps(err))
    assert back.path == Path("/x/y.jpg") and back.reason == "zero-byte file" and str(back) == str(err)


def test_truncated_loading_switch_is_refused(monkeypatch):
    assert ImageFile.LOAD_TRUNCATED_IMAGES is False  # nothing in helpers sets it
    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", True)
    with pytest.raises(DataError, match="LOAD_TRUNCATED_IMAGES") as info:
        load_rgb(FIXTURES / "truncated.jpg")
    assert not isinstance(info.value, BadImage)
    with pytest.raises(DataError, match="LOAD_TRUNCATED_IMAGES"):
        scan_images([FIXTURES / "rgb_patches.png"])


# ---------------------------------------------------------------- scan


def test_scan_sorts_fixtures_into_good_and_bad_in_order(caplog):
    files = [FIXTURES / n for n in sorted(EXPECTED)]
    with caplog.at_level(logging.WARNING, logger="helpers.pipeline.images"):
        report = scan_images(files, max_workers=4)
    assert isinstance(report, ScanReport)
    assert [p.name for p in report.good] == GOOD
    assert [b.path.name for b in report.bad] == BAD
    for b in report.bad:
        assert b.reason.startswith(EXPECTED[b.path.name]["reason"])
    assert report.n_checked == len(files)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == len(BAD)
    assert all(any(n in r.getMessage() for r in warnings) for n in BAD)
    frame = report.frame()
    assert list(frame.columns) == ["path", "reason"]
    assert frame["path"].map(lambda p: Path(p).name).tolist() == BAD


def test_scan_gives_the_same_answer_with_one_thread():
    files = [FIXTURES / n for n in sorted(EXPECTED)]
    assert scan_images(files, max_workers=1) == scan_images(files, max_workers=3)


def test_scan_of_nothing_and_frame_of_no_bad_file():
    empty = scan_images([])
    assert empty.good == () and empty.bad == ()
    assert list(scan_images([FIXTURES / "grey8.png"]).frame().columns) == ["path", "reason"]


@pytest.mark.parametrize("workers", [0, -1, 1.5, True])
def test_scan_rejects_bad_worker_counts(workers):
    with pytest.raises(ParameterError):
        scan_images([FIXTURES / "grey8.png"], max_workers=workers)


def test_image_suffixes_are_lower_case_with_dot():
    assert all(s.startswith(".") and s == s.lower() for s in IMAGE_SUFFIXES)
    assert {".jpg", ".jpeg", ".png"} <= set(IMAGE_SUFFIXES)


# ---------------------------------------------------------------- fixture script


def test_fixture_script_is_reproducible_and_matches_committed(tmp_path):
    module = _load_make_fixtures()
    first, second = module.make_fixtures(tmp_path / "a"), module.make_fixtures(tmp_path / "b")
    names = sorted(p.name for p in first.iterdir())
    assert names == sorted(p.name for p in second.iterdir())
    for name in names:
        assert (first / name).read_bytes() == (second / name).read_bytes(), name
    assert names == sorted(p.name for p in FIXTURES.iterdir())
    assert json.loads((first / "expected.json").read_text()) == json.loads((FIXTURES / "expected.json").read_text())
