"""Tests of the fast decode path (libjpeg-turbo, DCT scaling, uint8 augment) against the reference decode."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from helpers.errors import DeviceUnavailableError, ParameterError
from helpers.experiments import decode as XD
from helpers.pipeline import decode as D
from helpers.pipeline.baseline import BaselineDataset, ImageTransformConfig, item_generator, sample_augment
from helpers.pipeline.dataset import build_embedded, load_dataset
from helpers.pipeline.images import BadImage, load_rgb
from helpers.pipeline.text import build_tokenizer

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "data" / "fixtures"
EXPECTED = json.loads((FIXTURES / "expected.json").read_text(encoding="utf-8"))["files"]
GOOD = sorted(n for n, e in EXPECTED.items() if e["decodes"])
BAD = sorted(n for n, e in EXPECTED.items() if not e["decodes"])
COLOUR_FIXTURES = ["rgb_patches.png", "rgb_patches.jpg", "progressive.jpg", "cmyk.jpg",
                   "exif_orientation6.jpg", "exif_orientation8.jpg", "palette.png", "rgb16.png"]
PSNR_MIN = 30.0  # notebook 02's default psnr_min_db

# Pillow's transposes for EXIF orientations 2..8 (the table of PIL.ImageOps.exif_transpose).
PIL_METHOD = {
    2: Image.Transpose.FLIP_LEFT_RIGHT, 3: Image.Transpose.ROTATE_180, 4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE, 6: Image.Transpose.ROTATE_270, 7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}


def _photo(width: int, height: int) -> np.ndarray:
    """A textured RGB test picture (the astronaut photo, resized), (height, width, 3) uint8."""
    from skimage import data

    return np.asarray(Image.fromarray(data.astronaut()).resize((width, height), Image.Resampling.BICUBIC))


def _jpeg(path: Path, rgb: np.ndarray, *, orientation: int = 1, quality: int = 92, mode: str = "RGB") -> Path:
    im = Image.fromarray(rgb).convert(mode)
    kwargs = {"quality": quality}
    if orientation != 1:
        exif = Image.Exif()
        exif[D.EXIF_ORIENTATION_TAG] = orientation
        kwargs["exif"] = exif.tobytes()
    im.save(path, "JPEG", **kwargs)
    return path


def _both(path, *, index=0, epoch=0, seed=0, transform, config=D.DecodeConfig()):
    fast = D.decode_augment(path, seed=seed, epoch=epoch, index=index, transform=transform, config=config)
    ref = D.reference_augment(path, seed=seed, epoch=epoch, index=index, transform=transform)
    return fast, ref


# ---------------------------------------------------------------- pieces


@pytest.mark.parametrize("orientation", range(1, 9))
def test_apply_orientation_matches_pillow(orientation):
    arr = np.arange(5 * 7 * 3, dtype=np.uint8).reshape(5, 7, 3)
    im = Image.fromarray(arr)
    expected = np.asarray(im.transpose(PIL_METHOD[orientation]) if orientation > 1 else im)
    got = D.apply_orientation(arr, orientation)
    np.testing.assert_array_equal(got, expected)
    assert np.shares_memory(got, arr), "orientation is a view, no copy"


def test_invalid_orientation_is_ignored_like_pillow():
    arr = np.zeros((2, 3, 3), np.uint8)
    assert D.apply_orientation(arr, 9) is arr and D.apply_orientation(arr, 0) is arr


def test_read_header_of_fixtures():
    cmyk = D.read_header((FIXTURES / "cmyk.jpg").read_bytes())
    assert cmyk.colorspace in ("CMYK", "YCCK") and not cmyk.turbo_ok
    grey = D.read_header((FIXTURES / "grey.jpg").read_bytes())
    assert grey.colorspace == "Gray" and grey.turbo_ok and (grey.height, grey.width) == (72, 96)
    rot = D.read_header((FIXTURES / "exif_orientation6.jpg").read_bytes())
    assert rot.orientation == 6 and (rot.stored_height, rot.stored_width) == (96, 64)
    assert (rot.height, rot.width) == (64, 96), "upright size swaps the stored axes"
    assert D.read_header((FIXTURES / "rgb_patches.jpg").read_bytes()).orientation == 1
    for name in ("rgb_patches.png", "grey16.png", "not_an_image.jpg", "zero_bytes.jpg"):
        assert D.read_header((FIXTURES / name).read_bytes()) is None, name


def test_choose_dct_denominator():
    cfg = D.DecodeConfig()
    assert D.choose_dct_denominator(1000, 900, 100, cfg) == 8
    assert D.choose_dct_denominator(1000, 450, 100, cfg) == 4
    assert D.choose_dct_denominator(399, 1000, 100, cfg) == 2
    assert D.choose_dct_denominator(199, 1000, 100, cfg) == 1
    assert D.choose_dct_denominator(1000, 1000, 100, D.DecodeConfig(dct_scaling=False)) == 1
    assert D.choose_dct_denominator(1000, 1000, 100, D.DecodeConfig(max_denominator=2)) == 2
    assert D.choose_dct_denominator(400, 400, 100, D.DecodeConfig(margin=2.0)) == 2


@pytest.mark.parametrize("kwargs", [{"max_denominator": 3}, {"max_denominator": True}, {"margin": 0.5},
                                    {"margin": float("nan")}])
def test_decode_config_rejects_bad_values(kwargs):
    with pytest.raises(ParameterError):
        D.DecodeConfig(**kwargs)


def test_decode_jpeg_scaled_sizes(tmp_path):
    path = _jpeg(tmp_path / "p.jpg", _photo(333, 250))
    data = path.read_bytes()
    header = D.read_header(data)
    for d in (1, 2, 4, 8):
        arr = D.decode_jpeg_scaled(data, header, d)
        assert arr.shape == (-(-250 // d), -(-333 // d), 3) and arr.dtype == np.uint8


def test_psnr():
    a = np.zeros((4, 4, 3), np.uint8)
    assert D.psnr(a, a) == float("inf")
    b = a.copy()
    b[0, 0, 0] = 255
    assert D.psnr(a, b) == pytest.approx(10 * np.log10(255**2 / (255**2 / 48)))
    with pytest.raises(ParameterError):
        D.psnr(a, np.zeros((4, 5, 3)))


def test_out_must_fit():
    tr = ImageTransformConfig(image_size=16)
    with pytest.raises(ParameterError, match="out must be"):
        D.decode_augment(FIXTURES / "rgb_patches.jpg", seed=0, epoch=0, index=0, transform=tr,
                         out=np.zeros((16, 16, 4), np.uint8))


# ---------------------------------------------------------------- same pixels as the reference


@pytest.mark.parametrize("name", GOOD)
@pytest.mark.parametrize("size", [16, 48])
def test_every_good_fixture_matches_the_reference(name, size):
    tr = ImageTransformConfig(image_size=size)
    for index in range(3):
        fast, ref = _both(FIXTURES / name, index=index, transform=tr)
        assert fast.image.shape == (size, size, 3) and fast.image.dtype == np.uint8
        assert D.psnr(fast.image, ref) >= PSNR_MIN, (name, fast.route, fast.denominator)
        expected_route = "turbo" if name.endswith(".jpg") and name != "cmyk.jpg" else "reference"
        assert fast.route == expected_route, (name, fast.why)
        if fast.denominator == 1:  # no DCT scaling: the same decoder, the same integer crop
            assert np.abs(fast.image.astype(int) - ref).max() <= 2, name


def test_cmyk_takes_the_reference_route_and_says_why():
    fast, ref = _both(FIXTURES / "cmyk.jpg", transform=ImageTransformConfig(image_size=32))
    assert fast.route == "reference" and "CMYK" in fast.why
    np.testing.assert_array_equal(fast.image, ref)


@pytest.mark.parametrize("name", ["grey16.png", "rgb16.png", "palette.png", "rgba.png", "grey_alpha.png"])
def test_non_jpeg_takes_the_reference_route_exactly(name):
    fast, ref = _both(FIXTURES / name, transform=ImageTransformConfig(image_size=32), index=5)
    assert fast.route == "reference" and fast.why == "not a JPEG"
    np.testing.assert_array_equal(fast.image, ref)


@pytest.mark.parametrize("name", BAD)
def test_bad_fixture_raises_the_reference_reason(name):
    with pytest.raises(BadImage) as info:
        D.decode_augment(FIXTURES / name, seed=0, epoch=0, index=0, transform=ImageTransformConfig(image_size=16))
    assert info.value.reason.startswith(EXPECTED[name]["reason"])


def test_missing_file_is_a_bad_image(tmp_path):
    with pytest.raises(BadImage, match="missing file"):
        D.decode_augment(tmp_path / "nope.jpg", seed=0, epoch=0, index=0, transform=ImageTransformConfig(16))


@pytest.mark.parametrize("name", [n for n in COLOUR_FIXTURES])
@pytest.mark.parametrize("config", [D.DecodeConfig(), D.DecodeConfig(dct_scaling=False)], ids=["dct", "full"])
def test_channel_order_is_rgb_on_every_route(name, config):
    # the whole picture, squashed to 32 x 32, no flip: the colour squares stay in their corners
    tr = ImageTransformConfig(image_size=32, crop_scale=(1.0, 1.0), crop_ratio=(1.5, 1.5), flip_p=0.0)
    fast = D.decode_augment(FIXTURES / name, seed=0, epoch=0, index=0, transform=tr, config=config)
    img = fast.image.astype(int)
    for (y, x), channel in (((4, 2), 0), ((4, 29), 1), ((27, 2), 2)):
        px = img[y, x]
        assert px[channel] > 150 and all(px[c] < 100 for c in range(3) if c != channel), (name, (y, x), px)


def test_grey_jpeg_is_replicated_into_rgb():
    fast, ref = _both(FIXTURES / "grey.jpg", transform=ImageTransformConfig(image_size=24))
    assert fast.route == "turbo"
    np.testing.assert_array_equal(fast.image[..., 0], fast.image[..., 1])
    np.testing.assert_array_equal(fast.image[..., 0], fast.image[..., 2])
    assert D.psnr(fast.image, ref) >= PSNR_MIN


@pytest.mark.parametrize("orientation", range(1, 9))
@pytest.mark.parametrize("config", [D.DecodeConfig(), D.DecodeConfig(dct_scaling=False)], ids=["dct", "full"])
def test_exif_orientation_on_the_fast_path(tmp_path, orientation, config):
    stored = _photo(320, 240)
    path = _jpeg(tmp_path / f"o{orientation}.jpg", stored, orientation=orientation)
    upright = load_rgb(path)
    assert upright.shape[:2] == ((320, 240) if orientation >= 5 else (240, 320))
    tr = ImageTransformConfig(image_size=48)
    for index in range(4):
        fast, ref = _both(path, index=index, transform=tr, config=config)
        assert (fast.height, fast.width) == upright.shape[:2]
        assert fast.route == "turbo"
        if config.dct_scaling:
            assert fast.denominator > 1, "the test means to exercise the scaled path"
            assert D.psnr(fast.image, ref) >= PSNR_MIN, (orientation, index, fast.denominator)
        else:
            assert np.abs(fast.image.astype(int) - ref).max() <= 2, (orientation, index)


def test_dct_scaling_is_used_and_within_tolerance_on_photos(tmp_path):
    tr = ImageTransformConfig(image_size=64)
    sizes = [(1400, 1100), (700, 500), (200, 300), (900, 160), (100, 120)]
    seen = set()
    for k, (w, h) in enumerate(sizes):
        path = _jpeg(tmp_path / f"p{k}.jpg", _photo(w, h), quality=75 + 5 * k)
        for index in range(6):
            fast, ref = _both(path, index=index, epoch=1, transform=tr)
            seen.add(fast.denominator)
            assert D.psnr(fast.image, ref) >= PSNR_MIN, (w, h, index, fast.denominator)
    assert seen == {1, 2, 4, 8}


# ---------------------------------------------------------------- same draws as the baseline


@pytest.fixture(scope="module")
def embedded(tmp_path_factory):
    index = load_dataset(build_embedded(tmp_path_factory.mktemp("emb") / "d", n_images=12, seed=3))
    return index, build_tokenizer(list(index.captions), vocab_size=96)


def test_same_crop_draws_as_the_baseline(embedded):
    index, tokenizer = embedded
    tr = ImageTransformConfig(image_size=40)
    base = BaselineDataset(index, tokenizer, image_size=40, text_len=8, seed=11, transform=tr)
    base.set_epoch(2)
    mean = np.asarray(tr.mean, np.float32)[:, None, None]
    std = np.asarray(tr.std, np.float32)[:, None, None]
    for i in range(len(index)):
        fast = D.decode_augment(index.paths[i], seed=11, epoch=2, index=i, transform=tr)
        rgb = load_rgb(index.paths[i])
        assert fast.params == sample_augment(item_generator(11, 2, i), rgb.shape[0], rgb.shape[1], tr)
        baseline_pixels = (base[i]["image"].numpy() * std + mean) * 255  # undo the normalization
        assert D.psnr(fast.image.transpose(2, 0, 1).astype(np.float64), baseline_pixels) >= PSNR_MIN
        unscaled = D.decode_augment(index.paths[i], seed=11, epoch=2, index=i, transform=tr,
                                    config=D.DecodeConfig(dct_scaling=False))
        assert np.abs(unscaled.image.transpose(2, 0, 1) - baseline_pixels).max() <= 2.01


def test_plan_then_run_equals_decode_augment(embedded):
    index, _ = embedded
    tr = ImageTransformConfig(image_size=32)
    plan = D.plan_decode(index.paths[3], seed=1, epoch=0, index=3, transform=tr)
    assert plan.route == "turbo" and plan.params is not None and plan.data[:2] == b"\xff\xd8"
    np.testing.assert_array_equal(D.run_plan(plan, tr).image,
                                  D.decode_augment(index.paths[3], seed=1, epoch=0, index=3, transform=tr).image)
    png = D.plan_decode(FIXTURES / "rgba.png", seed=1, epoch=0, index=3, transform=tr)
    assert png.route == "reference" and png.params is None and png.header is None


def test_fast_flags_stay_within_tolerance(embedded):
    index, _ = embedded
    tr = ImageTransformConfig(image_size=48)
    cfg = D.DecodeConfig(fastdct=True, fastupsample=True)
    for i in range(4):
        fast, ref = _both(index.paths[i], index=i, transform=tr, config=cfg)
        assert D.psnr(fast.image, ref) >= PSNR_MIN


# ---------------------------------------------------------------- GPU / NPU variants, faked


class _FakeAcc:
    def __init__(self, kind):
        self.kind = kind
        self.device = kind


def test_cuda_decode_is_not_applicable_on_cpu():
    ok, why = D.cuda_decode_support(_FakeAcc("cpu"))
    assert not ok and "CUDA" in why
    with pytest.raises(DeviceUnavailableError, match="not available"):
        D.decode_augment_cuda([], 16, _FakeAcc("cpu"))


def test_cuda_decode_needs_torchvision(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torchvision" else real(name, *a))
    ok, why = D.cuda_decode_support(_FakeAcc("cuda"))
    assert not ok and "torchvision is not installed" in why


def _fake_torchvision(monkeypatch):
    """A stand-in for torchvision.io: decodes with Pillow, at full size, EXIF ignored (as nvjpeg does)."""
    import importlib.machinery
    import sys
    import types

    import torch

    def decode_jpeg(inputs, mode, device):
        out = []
        for t in inputs:
            with Image.open(io.BytesIO(t.numpy().tobytes())) as im:
                arr = np.asarray(im.convert("RGB"))
            out.append(torch.from_numpy(arr.copy()).permute(2, 0, 1).to(device))
        return out

    tv = types.ModuleType("torchvision")
    tv.__spec__ = importlib.machinery.ModuleSpec("torchvision", None)
    tv_io = types.ModuleType("torchvision.io")
    tv_io.decode_jpeg = decode_jpeg
    tv_io.ImageReadMode = types.SimpleNamespace(RGB="RGB")
    tv.io = tv_io
    monkeypatch.setitem(sys.modules, "torchvision", tv)
    monkeypatch.setitem(sys.modules, "torchvision.io", tv_io)


def test_gpu_decode_path_logic_with_a_fake_nvjpeg(monkeypatch, tmp_path):
    import torch

    _fake_torchvision(monkeypatch)
    acc = _FakeAcc("cuda")
    acc.device = torch.device("cpu")  # the crop/resize/flip/orientation logic runs the same on any device
    assert D.cuda_decode_support(acc)[0]
    tr = ImageTransformConfig(image_size=48)
    files = [FIXTURES / "rgb_patches.jpg", FIXTURES / "exif_orientation6.jpg", FIXTURES / "grey.jpg"]
    files += [_jpeg(tmp_path / f"o{o}.jpg", _photo(320, 240), orientation=o) for o in (3, 5, 8)]
    plans = [D.plan_decode(f, seed=2, epoch=1, index=k, transform=tr) for k, f in enumerate(files)]
    out = D.decode_augment_cuda(plans, 48, acc)
    assert out.dtype == torch.uint8 and tuple(out.shape) == (len(files), 48, 48, 3)
    for k, f in enumerate(files):
        ref = D.reference_augment(f, seed=2, epoch=1, index=k, transform=tr)
        assert D.psnr(out[k].numpy(), ref) >= PSNR_MIN, f.name
    cmyk = D.plan_decode(FIXTURES / "cmyk.jpg", seed=0, epoch=0, index=0, transform=tr)
    with pytest.raises(ParameterError, match="CPU path"):
        D.decode_augment_cuda([cmyk], 48, acc)


def test_npu_note_claims_nothing_unverified():
    note = D.npu_decode_note()
    assert "not verified" in note and "torchvision_npu" in note


def test_usable_cores_is_positive():
    assert D.usable_cores() >= 1


# ---------------------------------------------------------------- the benchmark entry point


def test_input_decode_bench_returns_its_keys(embedded, monkeypatch):
    index, _ = embedded
    out = XD.input_decode_bench(data_dir=str(index.root), batch_size=4, image_size=32, text_len=8, threads=2,
                                repeats=3, warmup=0, device="cpu")
    for key in ("preprocess_speedup", "decode_efficiency", "tokenize_speedup", "tokenize_share"):
        assert isinstance(out[key], float) and out[key] > 0, key
    lo, hi = out["preprocess_speedup_ci"]
    assert lo <= out["preprocess_speedup"] <= hi
    assert out["images"] == len(index) and out["threads"] == 2 and out["device"] == "cpu"
    assert out["skipped_files"] == 0
    json.dumps(out)  # the command prints it as JSON


def test_input_decode_bench_figures_come_from_their_own_comparison(embedded):
    """Each ratio equals the ratio of the two rates reported for it, and each rate names its variant."""
    from helpers.experiments.decode import BASELINE_LABEL, BATCHED_DEVICE_LABEL, BATCHED_HOST_LABEL, RAW_DECODE_LABEL

    index, _ = embedded
    out = XD.input_decode_bench(data_dir=str(index.root), batch_size=4, image_size=32, text_len=8, threads=2,
                                repeats=3, warmup=0, device="cpu")
    assert out["decode_efficiency"] == pytest.approx(out["batched_host_images_per_s"] / out["raw_decode_images_per_s"])
    assert out["preprocess_speedup"] == pytest.approx(out["batched_device_images_per_s"] / out["baseline_images_per_s"])
    assert out["variants"] == {"baseline_images_per_s": BASELINE_LABEL,
                               "batched_device_images_per_s": BATCHED_DEVICE_LABEL,
                               "batched_host_images_per_s": BATCHED_HOST_LABEL,
                               "raw_decode_images_per_s": RAW_DECODE_LABEL}
    assert "batched_images_per_s" not in out  # the ambiguous key is gone


def test_input_decode_bench_counts_skipped_files_and_reports_them_once(tmp_path, embedded, caplog):
    import logging
    import shutil

    from helpers.pipeline.prepare import prepare_data

    index, _ = embedded
    folder = tmp_path / "mixed"
    folder.mkdir()
    for k, src in enumerate(index.paths[:6]):
        shutil.copy(src, folder / f"good_{k}.jpg")
    shutil.copy(FIXTURES / "truncated.jpg", folder / "truncated.jpg")
    (folder / "zero.jpg").write_bytes(b"")
    kw = dict(batch_size=4, image_size=32, text_len=8, threads=1, repeats=3, warmup=0, device="cpu")
    with caplog.at_level(logging.WARNING):
        out = XD.input_decode_bench(data_dir=str(folder), **kw)
    assert out["skipped_files"] == 2 and out["images"] == 6
    assert sum("file(s) skipped" in r.getMessage() for r in caplog.records) == 1
    # Data loaded once by the caller is not scanned again: the skipped files are counted, not logged again.
    prepared = prepare_data(str(folder), batch_size=4, text_len=8)
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        out = XD.input_decode_bench(data_dir=str(folder), prepared=prepared, **kw)
    assert out["skipped_files"] == 2 and out["images"] == 6
    assert not [r for r in caplog.records if "skipped" in r.getMessage() or "bad image" in r.getMessage()]


# ---------------------------------------------------------------- figures of notebook 02


def test_throughput_bars_draws_one_panel_per_comparison():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    from helpers.workbook import plots_decode

    rows = [{"comparison": "speedup", "variant": "per-image baseline", "rate": 250.0, "rate_p25": 240.0,
             "rate_p75": 260.0},
            {"comparison": "speedup", "variant": "batched + device normalize", "rate": 950.0, "rate_p25": 900.0,
             "rate_p75": 1000.0},
            {"comparison": "efficiency", "variant": "batched (host)", "rate": 1270.0, "rate_p25": 1200.0,
             "rate_p75": 1300.0},
            {"comparison": "efficiency", "variant": "raw decode only", "rate": 2070.0, "rate_p25": 2000.0,
             "rate_p75": 2100.0}]
    fig = plots_decode.throughput_bars(pd.DataFrame(rows), title="t")
    try:
        axes = fig.axes
        assert [ax.get_title(loc="left") for ax in axes] == ["speedup", "efficiency"]
        assert [[t.get_text() for t in ax.get_yticklabels()] for ax in axes] == [
            ["per-image baseline", "batched + device normalize"], ["batched (host)", "raw decode only"]]
        assert axes[0].get_xlim() == axes[1].get_xlim() and axes[0].get_xlim()[1] > 2100
        # each bar is labelled with its own rate
        labels = [t.get_text().strip() for ax in axes for t in ax.texts]
        assert labels == ["250", "950", "1,270", "2,070"]
    finally:
        plt.close(fig)


def test_dct_scales_leaves_room_for_the_count_labels():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from helpers.workbook import plots_decode

    fig = plots_decode.dct_scales({1: 0, 2: 3, 4: 235, 8: 10})
    try:
        ax = fig.axes[0]
        assert ax.get_ylim()[1] >= 235 * 1.1
        assert [t.get_text() for t in ax.texts] == ["0", "3", "235", "10"]
    finally:
        plt.close(fig)


# --------------------------------------------------------------------------- the notebook's result


def _cmp(a_s, b_s, name_a, name_b):
    from helpers.timing import Comparison, Measurement

    def m(name, s):
        return Measurement(name=name, times_s=tuple(s * (1 + 0.01 * ((i % 3) - 1)) for i in range(8)), warmup=0,
                           items_per_call=8)

    return Comparison.from_measurements(m(name_a, a_s), m(name_b, b_s))


def _decode_result(*, cache=True, gil=True, psnr_db=(35.0, 40.0, 45.0), device_kind="cpu"):
    import pandas as pd

    pre = _cmp(0.4, 0.1, XD.BASELINE_LABEL, XD.BATCHED_DEVICE_LABEL)
    eff = _cmp(0.05, 0.08, XD.RAW_DECODE_LABEL, XD.BATCHED_HOST_LABEL)
    outcome = (XD.CacheOutcome(cmp=_cmp(0.08, 0.02, XD.BATCHED_HOST_LABEL, XD.CACHED_LABEL), psnr=(33.0, 36.0),
                               images=48, failed=0, mib=1.5, build_s=None) if cache
               else XD.CacheOutcome(why="the parameter dataset_cache is off"))
    routes = pd.DataFrame({"file": ["a.jpg", "b.png", "bad.jpg"], "route": ["turbo", "reference", "rejected"],
                           "reference": ["ok", "ok", "rejected"], "agree": [True, True, True],
                           "psnr_db": [50.0, float("inf"), float("nan")], "same picture": [True, True, "n/a"]})
    return XD.DecodeResult(
        params={"psnr_min_db": 30.0, "batch_size": 8, "image_size": 64, "repeats": 3, "warmup": 1, "threads": 0},
        device_kind=device_kind, images=48, skipped=0, classes=4, source="embedded", threads=2, cores=2, pinned=False,
        pinned_note="no pinned memory on a CPU", dct_scaling=True, n_plans=48, scales={4: 40, 8: 8}, full_px=1000,
        decoded_px=100, check=pd.DataFrame({"psnr_db": list(psnr_db)}), model_input="model input", routes=routes,
        mid_epoch="batch of 4", gil=_cmp(0.2, 0.1, "raw decode, 1 thread(s)", "raw decode, 2 threads") if gil else None,
        flags=_cmp(0.1, 0.1, "default decoder", "fast flags"), flag_psnr=31.0, pre=pre, eff=eff,
        tok=_cmp(0.002, 0.001, "per-sample encode", "encode_batch"),
        share={"batched_share": 0.01, "per_sample_share": 0.005, "tokenize_batch_s": 0.001,
               "tokenize_per_sample_s": 0.002, "host_s": 0.08, "baseline_s": 0.4},
        cache=outcome, gpu=None, gpu_psnr=(), gpu_why="no CUDA device", npu_note="DVPP not verified")


def _keys(records):
    out = []
    for call, args, kw in records.calls:
        if call == "add":
            out.append((args[0], args[1], args[2], args[4]))
        elif call == "add_measurement":
            out.append((args[0], args[1], kw["metric"], kw["unit"]))
        else:
            out.append((args[0], f"{args[1].b.name} vs {args[1].a.name}", kw.get("metric", "speedup"), kw["unit"]))
    return out


def test_the_decode_result_records_every_section_in_the_notebooks_order():
    keys = _keys(_decode_result().records())
    assert [k[0] for k in keys] == (["dataset", "dct scaling", "correctness", "correctness", "gil", "decoder flags"]
                                    + ["preprocess"] * 3 + ["decode efficiency"] * 3 + ["tokenize"] * 3
                                    + ["dataset cache"] * 2 + ["gpu decode"])
    assert keys[1] == ("dct scaling", "epoch 0", "decoded_pixel_fraction", "fraction")
    assert keys[6] == ("preprocess", f"{XD.BATCHED_DEVICE_LABEL} vs {XD.BASELINE_LABEL}", "speedup", "x")
    assert keys[9] == ("decode efficiency", f"{XD.BATCHED_HOST_LABEL} vs {XD.RAW_DECODE_LABEL}", "decode_efficiency",
                       "fraction")
    assert keys[-1] == ("gpu decode", "torchvision nvjpeg", "speedup", "x")
    none = _keys(_decode_result(cache=False, gil=False, device_kind="npu").records())
    assert ("gil", "1 vs N threads", "thread_speedup", "x") in none
    assert ("dataset cache", "decode-once cache", "speedup", "x") in none and none[-1][0] == "npu decode"


def test_the_decode_result_decides_batched_decode_and_the_cache():
    r = _decode_result()
    v = r.verdict()
    assert v.notebook == "02_batched_decode" and v.recommendation == "enable" and v.action.setting == "batched_decode"
    assert v.extra["dataset_cache"]["recommendation"] == "enable" and "already built" in v.extra["dataset_cache"]["reason"]
    assert "8 images of 64 px per batch from 48 images" in v.context
    assert "decode-once cache not measured: the parameter dataset_cache is off" in _decode_result(cache=False).cache_text
    assert _decode_result(cache=False).verdict().extra["dataset_cache"]["recommendation"] == "not applicable"
    bad = _decode_result(psnr_db=(20.0, 40.0))
    assert not bad.pixels_ok and bad.verdict().recommendation == "leave off"
    assert "SOME IMAGES DIFFER" in bad.pixels_text and bad.pixel_fraction == 0.1
    assert "40 of 48 images" not in r.scaling_text and "1/4: 40, 1/8: 8" in r.scaling_text


def test_the_decode_results_panel_offers_threads_dct_scaling_and_crop_size():
    from helpers.live import Knob, TrySpec

    spec = _decode_result().try_it(None, {"threads": 0, "image_size": 64, "repeats": 3, "warmup": 1,
                                          "batch_size": 8})
    assert isinstance(spec, TrySpec) and set(spec.knobs) == {"threads", "dct_scaling", "image_size"}
    assert isinstance(spec.knobs["threads"], Knob) and spec.knobs["threads"].value == 0
    assert spec.knobs["dct_scaling"] is True and spec.reference.label == "threads=0 (=2), DCT on, 64px"
