"""Behaviour of the "try it" functions of notebooks 02, 03 and 04, at tiny sizes.

Each returns (or, for a sweep, yields) :class:`helpers.live.LivePoint` with the notebook's metric and unit; the
knob values reach the mechanism (the dataset's decoder and crop, the DataLoader's workers, the copy method); a
value the mechanism refuses raises ParameterError before any work. No test asserts a speed.
"""

from __future__ import annotations

import math
import warnings

import pytest

from helpers.device import get_accelerator
from helpers.errors import DeviceUnavailableError, ParameterError
from helpers.experiments import decode as XD
from helpers.experiments import loader_sweep as L
from helpers.experiments import pinning
from helpers.live import LivePoint
from helpers.pipeline.dataset import build_embedded, load_dataset
from helpers.pipeline import decode_bench, loader_timing
from helpers.pipeline.loader import TORCH_DEFAULT_PREFETCH, LoaderConfig
from helpers.pipeline.text import build_tokenizer
from helpers.experiments.registry import validate_notebook_params
from loader_support import Numbers, no_stray_workers  # noqa: F401  (no_stray_workers: a fixture)
from transfer_support import fake_accelerator, fake_pin  # noqa: F401  (fake_pin: a fixture)


# --------------------------------------------------------------------------- 02: batched decode


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    return load_dataset(build_embedded(tmp_path_factory.mktemp("emb") / "d", n_images=12, seed=3))


@pytest.fixture(scope="module")
def tokenizer(index):
    return build_tokenizer(list(index.captions), vocab_size=96)


@pytest.fixture(scope="module")
def params02():
    return validate_notebook_params("02_batched_decode", {"batch_size": 4, "text_len": 8, "seed": 1})


def _try_decode(params02, index, tokenizer, **kw):
    knobs = {"threads": 1, "dct_scaling": True, "image_size": 32, **kw}
    return XD.try_decode(params02, get_accelerator("cpu"), index, tokenizer, repeats=3, warmup=1, **knobs)


def test_try_decode_gives_the_batched_pipelines_images_per_second(params02, index, tokenizer):
    calls = []
    point = _try_decode(params02, index, tokenizer, progress=lambda d, t: calls.append((d, t)))
    assert isinstance(point, LivePoint)
    assert (point.metric, point.unit) == ("throughput", "images/s")
    assert point.value > 0 and point.low <= point.value <= point.high
    assert point.label == "threads=1, DCT on, 32px"
    assert point.extra["batch_size"] == 4 and point.extra["threads_used"] == 1
    assert calls == [(1, 2), (2, 2)]


def test_try_decode_knobs_reach_the_dataset_and_the_decoder(params02, index, tokenizer, monkeypatch):
    built, images = [], []
    real_dataset, real_to_device = XD.BatchedDataset, XD.to_device_batch

    def dataset(*args, **kwargs):
        built.append(kwargs)
        return real_dataset(*args, **kwargs)

    def to_device(batch, acc, **kw):
        images.append(tuple(batch["image"].shape))
        return real_to_device(batch, acc, **kw)

    monkeypatch.setattr(XD, "BatchedDataset", dataset)
    monkeypatch.setattr(decode_bench, "to_device_batch", to_device)  # DecodeBench normalizes there
    off = _try_decode(params02, index, tokenizer, threads=2, dct_scaling=False, image_size=48)
    assert built[-1]["threads"] == 2 and built[-1]["image_size"] == 48
    assert built[-1]["decode"].dct_scaling is False
    assert set(images) == {(4, 48, 48, 3)} and len(images) == 3 + 1  # repeats + warm-up, every one normalized
    assert off.extra["decoded_pixel_fraction"] == 1.0  # full-resolution decode without DCT scaling
    on = _try_decode(params02, index, tokenizer, threads=0, dct_scaling=True, image_size=32)
    assert built[-1]["decode"].dct_scaling is True and built[-1]["threads"] == 0
    assert on.extra["decoded_pixel_fraction"] < 1.0  # the embedded photos are far larger than 8 x 32 px
    assert on.label.startswith("threads=0 (=")  # 0: every usable core, and how many that was


@pytest.mark.parametrize("knobs, word", [({"threads": -1}, "threads"), ({"image_size": 8}, "image_size"),
                                         ({"dct_scaling": "yes"}, "dct_scaling")])
def test_try_decode_refuses_a_bad_knob_before_any_work(params02, index, tokenizer, monkeypatch, knobs, word):
    monkeypatch.setattr(XD, "BatchedDataset", lambda *a, **k: pytest.fail("no dataset for a bad knob"))
    with pytest.raises(ParameterError, match=word):
        _try_decode(params02, index, tokenizer, **knobs)


# --------------------------------------------------------------------------- 03: DataLoader settings


@pytest.fixture
def loaders(monkeypatch):
    """Every DataLoader try_loader builds, as built."""
    made, real = [], loader_timing.make_loader

    def capture(*args, **kwargs):
        made.append(real(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(loader_timing, "make_loader", capture)  # the sweep's loaders are built there
    return made


BASE = LoaderConfig(batch_size=4, timeout_s=60.0, seed=0)


def _try_loader(**kw):
    knobs = {"num_workers": 0, "prefetch_factor": None, "persistent_workers": False, **kw}
    return L.try_loader(lambda s: Numbers(40), 40, base=BASE, batches_per_trial=2, trials=2, items="samples",
                        **knobs)


def test_try_loader_gives_samples_per_second_through_the_loader(loaders):
    calls = []
    point = _try_loader(progress=lambda d, t: calls.append((d, t)))
    assert isinstance(point, LivePoint)
    assert (point.metric, point.unit) == ("throughput", "samples/s")
    assert point.value > 0 and point.low <= point.value <= point.high
    assert point.label == "workers=0" and point.extra["trials"] == 2 and point.extra["first_batch_s"] >= 0
    assert [lo.num_workers for lo in loaders] == [0, 0]  # one loader per trial without persistent workers
    assert calls == [(0, 2), (1, 2), (2, 2)]


def test_try_loader_knobs_reach_the_dataloader(loaders, no_stray_workers):  # noqa: F811
    point = _try_loader(num_workers=2, prefetch_factor=3, persistent_workers=True)
    assert len(loaders) == 1, "persistent workers: one loader serves every trial"
    lo = loaders[0]
    assert (lo.num_workers, lo.prefetch_factor, lo.persistent_workers) == (2, 3, True)
    assert point.label == "workers=2, prefetch=3, persistent"
    assert point.extra["in_flight"] == 6 and point.extra["batches_per_trial"] == 4  # two batches per worker


def test_try_loader_prefetch_none_with_workers_is_torchs_default(loaders, no_stray_workers):  # noqa: F811
    _try_loader(num_workers=1, prefetch_factor=None)
    assert {lo.prefetch_factor for lo in loaders} == {TORCH_DEFAULT_PREFETCH}


@pytest.mark.parametrize("knobs, word", [
    ({"num_workers": 0, "prefetch_factor": 2}, "prefetch_factor"),  # torch's DataLoader raises ValueError too
    ({"num_workers": 0, "persistent_workers": True}, "persistent_workers"),
    ({"num_workers": -1}, "num_workers"),
    ({"num_workers": 1, "prefetch_factor": 0}, "prefetch_factor"),
    ({"persistent_workers": "no"}, "persistent_workers"),
])
def test_try_loader_refuses_what_the_dataloader_refuses(loaders, knobs, word):
    with pytest.raises(ParameterError, match=word):
        _try_loader(**knobs)
    assert not loaders, "refused before any loader is built"


def test_live_point_of_a_sweep_names_an_unknown_setting(loaders):
    result = L.run_sweep(lambda s: Numbers(40), 40, (L.LoaderSetting(0),), base=BASE, batches_per_trial=2, trials=1)
    assert L.live_point(result, "workers=0", items="images").unit == "images/s"
    with pytest.raises(ParameterError, match="workers=5"):
        L.live_point(result, "workers=5")


# --------------------------------------------------------------------------- 04: pinned memory


def test_try_pinning_gives_host_to_device_gbps(fake_pin):
    point = pinning.try_pinning(fake_accelerator(), size_mib=1 / 64, method="pageable", repeats=3, warmup=1,
                                link_gbps=10.0)
    assert isinstance(point, LivePoint)
    assert (point.metric, point.unit) == ("h2d_bandwidth", "GB/s")
    assert point.value > 0 and point.low <= point.value <= point.high
    assert point.extra["method"] == "pageable" and point.extra["size_bytes"] == 16384
    assert point.extra["fraction_of_link"] == pytest.approx(point.value / 10.0)
    assert not fake_pin, "a pageable copy pins nothing"


def test_try_pinning_method_and_size_reach_the_copy(fake_pin):
    acc = fake_accelerator()
    pinning.try_pinning(acc, size_mib=0.25, method="pin_per_batch", repeats=3, warmup=1)
    assert fake_pin == [2**18] * (3 + 1), "every copy, warm-up included, pinned the whole transfer"
    ref = pinning.try_pinning(acc, size_mib=0.5, method=pinning.REFERENCE_METHOD, repeats=3, warmup=1)
    assert ref.value == pytest.approx(2**19 / 2e-3 / 1e9)  # the fake device's events say 2 ms per copy


def test_try_pinning_all_yields_one_point_per_method_and_reports_progress(fake_pin):
    calls = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # pin_memory=True in a DataLoader without an accelerator
        points = pinning.try_pinning(fake_accelerator(), size_mib=1 / 256, method="all", repeats=3, warmup=1,
                                     progress=lambda d, t: calls.append((d, t)))
        assert not isinstance(points, LivePoint)
        points = list(points)
    assert [p.extra["method"] for p in points] == list(pinning.TRY_METHODS)
    assert all(p.unit == "GB/s" and p.metric == "h2d_bandwidth" for p in points)
    n = len(pinning.TRY_METHODS)
    assert calls == [(k, n) for k in range(n)] + [(n, n)]


@pytest.mark.parametrize("knobs, word", [({"size_mib": 0}, "size_mib"), ({"size_mib": -1.0}, "size_mib"),
                                         ({"size_mib": "big"}, "size_mib"), ({"size_mib": math.inf}, "size_mib"),
                                         ({"method": "telepathy"}, "telepathy"), ({"repeats": 0}, "repeats")])
def test_try_pinning_refuses_a_bad_knob_before_any_copy(knobs, word, monkeypatch):
    monkeypatch.setattr(pinning, "bandwidth_sweep", lambda *a, **k: pytest.fail("nothing is copied"))
    args = {"size_mib": 1.0, "method": "all", **knobs}
    with pytest.raises(ParameterError, match=word):
        pinning.try_pinning(fake_accelerator(), **args)


def test_try_pinning_on_a_cpu_says_where_it_applies():
    with pytest.raises(DeviceUnavailableError, match="CUDA GPU or an Ascend NPU"):
        pinning.try_pinning(get_accelerator("cpu"), size_mib=1.0, method="pageable")


def test_live_point_refuses_a_not_applicable_row():
    row = pinning.bandwidth_sweep(get_accelerator("cpu"), [4096]).iloc[0]
    with pytest.raises(ParameterError, match="no rate"):
        pinning.live_point(row)
