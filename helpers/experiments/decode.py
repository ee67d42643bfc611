"""Notebook 02's experiment: per-image decode against the batched pipeline, on one dataset, and its benchmark.

:func:`run` does the notebook's whole measurement and returns a :class:`DecodeResult`, which knows the
notebook's records, its verdict (with the decode-once cache's own decision) and its try-it panel.

:class:`DecodeBench` holds the interleaved comparisons of notebook 02
(preprocessing speedup, decode efficiency against the raw decoder, thread
scaling, decoder flags, GPU decode, tokenization);
:func:`input_decode_bench` runs the same comparisons for ``python -m helpers
bench input-pipeline``. The mechanisms they time are
:class:`helpers.pipeline.fast.BatchedDataset`,
:func:`helpers.pipeline.fast.to_device_batch`,
:class:`helpers.pipeline.baseline.BaselineDataset` and the decoder routes of
:mod:`helpers.pipeline.decode`.

Where the parts live (imported here, where notebooks, tests and the bench find them): :class:`DecodeBench` and
the variants' labels in :mod:`helpers.pipeline.decode_bench`; what the result's cells print in
:mod:`helpers.experiments.decode_text`.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from dataclasses import KW_ONLY, dataclass, field, replace
from typing import Any, Callable, Mapping, Sequence

from helpers import specs
from helpers.checklist import Item
from helpers.conditions import held, ran_with, sides
from helpers.device import get_accelerator
from helpers.errors import ParameterError
from helpers.experiments import registry
from helpers.experiments.base import Experiment, ExperimentResult, Optimization, checked_fields, no_expected_warnings
from helpers.experiments.decode_text import _ONE_THREAD, DecodeChecksTexts, DecodeResultTexts
from helpers.live import Knob, LivePoint, Progress, TrySpec, no_progress
from helpers.params import Param
from helpers.pipeline.baseline import collate_batch, host_to_device
from helpers.pipeline.decode import DecodeConfig, cuda_decode_support, psnr
from helpers.pipeline.decode_bench import (
    BASELINE_LABEL,
    BATCHED_DEVICE_LABEL,
    BATCHED_HOST_LABEL,
    CACHED_LABEL,
    RAW_DECODE_LABEL,
    DecodeBench,
)
from helpers.pipeline.fast import BatchedDataset, to_device_batch
from helpers.pipeline.prepare import prepare_data
from helpers.pipeline.sampler import check_int
from helpers.results import Records
from helpers.timing import Comparison, Measurement
from helpers.verdict import Action, Verdict
from helpers.workload import DEFAULT

logger = logging.getLogger(__name__)

__all__ = ["BASELINE_LABEL", "BATCHED_DEVICE_LABEL", "BATCHED_HOST_LABEL", "RAW_DECODE_LABEL", "DecodeBench", "verdict",
           "input_decode_bench", "decoded_pixel_fraction", "live_point", "try_decode", "CacheOutcome",
           "DecodeChecks", "DecodeResult", "check", "run", "CACHED_LABEL"]

# --------------------------------------------------------------------------- benchmark


def input_decode_bench(*, data_dir: str | None = None, max_images: int = 0, batch_size: int = DEFAULT.batch_size,
                       image_size: int = DEFAULT.image_size, text_len: int = DEFAULT.text_len, threads: int = 0,
                       repeats: int = 10,
                       warmup: int = 2, seed: int = 0, device: str = "cpu", prepared: tuple | None = None) -> dict:
    """Measure the batched pipeline against the per-image baseline: the figures of ``bench input-pipeline``.

    Two interleaved comparisons (helpers.timing.compare, see
    :class:`helpers.pipeline.fast.DecodeBench`), the same as notebook 02's;
    every rate below comes from one of them and says which by its name:

    * ``preprocess_speedup``: images/s of "batched + device normalize"
      (``BatchedDataset[indices]`` + ``to_device_batch``) over the "per-image
      baseline" (``BaselineDataset`` items + ``collate_batch`` + copy to the
      device), on the same batches;
    * ``decode_efficiency``: images/s of "batched (host)" (``BatchedDataset[indices]``,
      no device step) over "raw decode only" (the same decoder, DCT scales
      and thread count, from bytes in memory), measured together;
    * ``tokenize_speedup``: per-sample ``encode_one`` time over one
      ``encode_batch`` call for the same captions; ``tokenize_share``:
      ``encode_batch``'s median time over the "batched (host)" median time of
      the efficiency comparison.

    Parameters
    ----------
    data_dir : str, optional
        Folder of images; None or "" for the embedded dataset.
    max_images : int, default 0
        Use at most this many images (0: all).
    batch_size, image_size, text_len : int
        As notebook 02.
    threads : int, default 0
        Decode threads (0: usable cores).
    repeats, warmup : int
        Timed and untimed batches per variant.
    seed : int
    device : str, default "cpu"
        Device kind for the normalization step (``helpers.device.get_accelerator``).
    prepared : (DatasetIndex, tokenizers.Tokenizer), optional
        Data already loaded by :func:`helpers.pipeline.prepare.prepare_data`
        with the same ``data_dir``, ``max_images``, ``seed`` and ``text_len``
        (and checked for ``batch_size``); the folder is then not scanned again,
        so its skipped files are not reported (logged) a second time. None:
        load it here.

    Returns
    -------
    dict
        ``preprocess_speedup``, ``preprocess_speedup_ci`` ([low, high]),
        ``baseline_images_per_s``, ``batched_device_images_per_s`` (its two
        rates); ``decode_efficiency``, ``decode_efficiency_ci``,
        ``batched_host_images_per_s``, ``raw_decode_images_per_s`` (its two
        rates); ``tokenize_speedup``, ``tokenize_speedup_ci``,
        ``tokenize_share``; ``variants`` (each rate key -> the variant's
        label); ``threads``, ``batch_size``, ``image_size``, ``images``
        (usable), ``skipped_files`` (files of the folder skipped as unusable
        by the scan), ``device``.

    Raises
    ------
    helpers.errors.DataError
        If the dataset holds fewer images than one batch.
    """

    acc = get_accelerator(device)
    if prepared is None:
        prepared = prepare_data(data_dir, max_images=max_images, seed=seed, batch_size=batch_size,
                                text_len=text_len)
    index, tokenizer = prepared
    dataset = BatchedDataset(index, tokenizer, image_size=image_size, text_len=text_len, seed=seed,
                             threads=threads, pin_memory=acc.capabilities.pinned_memory.available)
    try:
        bench = DecodeBench(dataset, acc, batch_size=batch_size, repeats=repeats, warmup=warmup, seed=seed)
        pre = bench.compare_preprocess()
        eff = bench.compare_raw_decode()
        tok = bench.compare_tokenize()
        share = bench.tokenize_share(host_s=eff.b.median_s, baseline_s=pre.a.median_s)
        threads_used = dataset.threads
    finally:
        dataset.close()
    return {
        "preprocess_speedup": pre.ratio,
        "preprocess_speedup_ci": [pre.ci_low, pre.ci_high],
        "baseline_images_per_s": pre.a.rate,
        "batched_device_images_per_s": pre.b.rate,
        "decode_efficiency": eff.ratio,
        "decode_efficiency_ci": [eff.ci_low, eff.ci_high],
        "batched_host_images_per_s": eff.b.rate,
        "raw_decode_images_per_s": eff.a.rate,
        "tokenize_speedup": tok.ratio,
        "tokenize_speedup_ci": [tok.ci_low, tok.ci_high],
        "tokenize_share": share["batched_share"],
        "variants": {
            "baseline_images_per_s": pre.a.name,
            "batched_device_images_per_s": pre.b.name,
            "batched_host_images_per_s": eff.b.name,
            "raw_decode_images_per_s": eff.a.name,
        },
        "threads": threads_used,
        "batch_size": batch_size,
        "image_size": image_size,
        "images": len(index),
        "skipped_files": len(index.skipped),
        "device": acc.kind,
    }


# --------------------------------------------------------------------------- try it


def decoded_pixel_fraction(plans: Sequence) -> float | None:
    """Pixels the JPEG decoder produces at the planned DCT scales, as a share of a full-resolution decode.

    Parameters
    ----------
    plans : sequence of helpers.pipeline.decode.DecodePlan
        From :meth:`BatchedDataset.decode_plan`; only the libjpeg-turbo route (``route == "turbo"``) counts.

    Returns
    -------
    float or None
        In (0, 1]; 1.0 with DCT scaling off; None when no plan takes the libjpeg-turbo route.
    """
    turbo = [p for p in plans if p.route == "turbo"]
    full = sum(p.header.stored_height * p.header.stored_width for p in turbo)
    if not full:
        return None
    decoded = sum(math.ceil(p.header.stored_height / p.denominator) * math.ceil(p.header.stored_width / p.denominator)
                  for p in turbo)
    return decoded / full


def live_point(m: Measurement, label: str, *, batch_size: int, pixel_fraction: float | None = None,
               **extra: Any) -> LivePoint:
    """A batched-pipeline measurement as a "try it" point: its median images/s and the IQR of the rate.

    Parameters
    ----------
    m : helpers.timing.Measurement
        Time per batch with ``items_per_call`` = images per batch, e.g. notebook 02's
        ``compare_preprocess().b`` (:data:`BATCHED_DEVICE_LABEL`) or :meth:`DecodeBench.measure_batched`.
    label : str
        The settings, e.g. ``"threads=2, DCT on, 64px"``.
    batch_size : int
        Images per batch (for the sentence).
    pixel_fraction : float, optional
        :func:`decoded_pixel_fraction` of the measured batches, added to the sentence.
    **extra
        More fields for the record.

    Returns
    -------
    LivePoint
        metric ``throughput``, unit ``images/s``; low/high: the rates at the quartiles of the times per batch;
        ``extra``: ``repeats`` (timed batches, the record's repeats), ``batch_size``, ``decoded_pixel_fraction``.
    """
    pixels = "" if pixel_fraction is None else f"; the decoder produced {pixel_fraction:.0%} of full-resolution pixels"
    low, high = sorted((m.rate_p25, m.rate_p75))
    sentence = (f"{label}: {m.name or BATCHED_DEVICE_LABEL} {m.rate:,.0f} images/s (IQR {low:,.0f}-{high:,.0f}, "
                f"{m.repeats} batches of {batch_size}){pixels}")
    return LivePoint.from_rate(label, m, unit="images/s", sentence=sentence, repeats=m.repeats,
                               batch_size=int(batch_size), decoded_pixel_fraction=pixel_fraction, **extra)


def try_decode(params: Mapping[str, Any], acc, index, tokenizer, *, threads: int, dct_scaling: bool,
               image_size: int, repeats: int = 10, warmup: int = 2, progress: Progress = no_progress) -> LivePoint:
    """Notebook 02's batched pipeline again with other decode threads, DCT scaling on or off, another crop size.

    A new :class:`helpers.pipeline.fast.BatchedDataset` over the same images and tokenizer is built with these
    three settings (``DecodeConfig(dct_scaling=...)``: libjpeg-turbo's reduced-size decode in the DCT domain, by
    simplejpeg) and timed like the notebook's "batched + device normalize" variant: the same batches of the
    notebook's ``batch_size`` (seeded sampler, epoch 0), ``dataset[indices]`` then ``to_device_batch`` each time,
    closed by a device synchronize, ``warmup`` batches excluded (:meth:`DecodeBench.measure_batched`). It runs
    alone, not interleaved with the per-image baseline as in the notebook's comparison, so compare it with the
    notebook's rate of the same variant, not with the speedup.

    Parameters
    ----------
    params : mapping
        Notebook 02's validated parameters (``batch_size``, ``text_len``, ``seed``).
    acc : helpers.device.Accelerator
        Where the batch is normalized; batch buffers are pinned where it can pin, as in the notebook.
    index : helpers.pipeline.dataset.DatasetIndex
        The notebook's images.
    tokenizer : tokenizers.Tokenizer
        The notebook's tokenizer.
    threads : int
        Decode threads, 0 for every usable core (0-256, notebook 02's ``threads``).
    dct_scaling : bool
        Decode JPEGs at 1/2, 1/4 or 1/8 size where the crop allows (True, the notebook's setting) or always at
        full size (False).
    image_size : int
        Side of the square crop, px (16-1024, notebook 02's ``image_size``).
    repeats, warmup : int
        Timed (>= 1) and untimed (>= 0) batches.
    progress : callable
        ``progress(done, 2)``: 1 when the dataset is built and the batches planned, 2 when measured.

    Returns
    -------
    LivePoint
        metric ``throughput``, unit ``images/s`` (:func:`live_point`); ``extra``: ``threads_used``,
        ``dct_scaling``, ``image_size``, ``batch_size``, ``decoded_pixel_fraction``.

    Raises
    ------
    helpers.errors.ParameterError
        For ``threads`` or ``image_size`` outside notebook 02's ranges (the message names the range), a
        ``dct_scaling`` that is not a bool, or ``repeats``/``warmup`` below their minimum.
    helpers.errors.DataError
        If the images do not fill one batch.
    """
    if not isinstance(dct_scaling, bool):
        raise ParameterError(f"dct_scaling must be True or False, got {dct_scaling!r}")
    p = registry.validate_notebook_params(NOTEBOOK, {**params, "threads": threads, "image_size": image_size},
                                 allow_unknown=True)
    check_int("repeats", repeats, 1)
    check_int("warmup", warmup, 0)
    dataset = BatchedDataset(index, tokenizer, image_size=p["image_size"], text_len=p["text_len"], seed=p["seed"],
                             threads=p["threads"], pin_memory=acc.capabilities.pinned_memory.available,
                             decode=DecodeConfig(dct_scaling=dct_scaling))
    try:
        bench = DecodeBench(dataset, acc, batch_size=p["batch_size"], repeats=repeats, warmup=warmup,
                            seed=p["seed"])
        used = bench.batches[:repeats + warmup]
        fraction = decoded_pixel_fraction(dataset.decode_plan([i for b in used for i in b]))
        progress(1, 2)
        m = bench.measure_batched()
        progress(2, 2)
        threads_used = dataset.threads
    finally:
        dataset.close()
    label = (f"threads={p['threads']}" + (f" (={threads_used})" if p["threads"] == 0 else "")
             + f", DCT {'on' if dct_scaling else 'off'}, {p['image_size']}px")
    return live_point(m, label, batch_size=p["batch_size"], pixel_fraction=fraction, threads_used=threads_used,
                      dct_scaling=dct_scaling, image_size=p["image_size"])


# --------------------------------------------------------------------------- the verdict

#: Notebook whose verdict :func:`verdict` gives.
NOTEBOOK = "02_batched_decode"
#: Least lower bound of the speedup's 95% interval that counts as a gain (5%: within run-to-run noise below).
SPEEDUP_THRESHOLD = 1.05


def batched_recommendation(pre: Comparison, pixels_ok: bool) -> str:
    """Batched decode's recommendation: "enable" when its speedup's interval is above :data:`SPEEDUP_THRESHOLD`
    and its pixels matched the reference, else "leave off" (the rule of :func:`verdict`)."""
    return "enable" if pre.ci_low > SPEEDUP_THRESHOLD and pixels_ok else "leave off"


def cache_decision(cmp: Comparison | None, *, batched_recommendation: str, build_s: float | None, cache_mib: float,
                   psnr_min_db: float | None, psnr_threshold_db: float, why_not: str = "") -> dict[str, Any]:
    """Whether to train from the decode-once cache: measurably faster than the batched decode, same pixels.

    Parameters
    ----------
    cmp : helpers.timing.Comparison or None
        :meth:`DecodeBench.compare_cache`; None when the cache was not measured (``why_not`` says why).
    batched_recommendation : str
        The batched decode's own recommendation: the cache feeds the batched pipeline, so it needs it.
    build_s : float or None
        Seconds this run spent building the cache (None: it was already built).
    cache_mib : float
        Its size on disk, MiB.
    psnr_min_db : float or None
        Worst PSNR of the cached batches against the per-image reference, dB.
    psnr_threshold_db : float
        The least that counts as the same pixels (notebook 02's ``psnr_min_db``).
    why_not : str
        Why the cache was not measured (a parameter, a size bound).

    Returns
    -------
    dict
        ``recommendation`` ("enable", "leave off" or "not applicable"), ``reason``, ``action`` (an
        :class:`helpers.verdict.Action` dict on ``dataset_cache``), ``speedup``, ``ci_low``, ``ci_high``,
        ``build_s``, ``cache_mib``, ``psnr_min_db``: what notebook 10 and the report read from notebook 02's
        verdict (``extra["dataset_cache"]``).
    """
    if cmp is None:
        rec, reason = "not applicable", f"the decode-once cache was not measured: {why_not}"
        fig: dict[str, Any] = {"speedup": None, "ci_low": None, "ci_high": None}
    else:
        fig = {"speedup": cmp.ratio, "ci_low": cmp.ci_low, "ci_high": cmp.ci_high}
        built = f"built in {build_s:.1f} s" if build_s is not None else "already built"
        reason = (f"the decode-once cache gave {cmp.ratio:.2f}x the batched decode's images/s (95% CI "
                  f"{cmp.ci_low:.2f}-{cmp.ci_high:.2f}; {cmp.b.rate:,.0f} vs {cmp.a.rate:,.0f} images/s), "
                  f"{cache_mib:.1f} MiB on disk, {built}; its crops matched the reference with PSNR >= "
                  f"{psnr_min_db:.1f} dB (threshold {psnr_threshold_db:g} dB; not pixel-identical: each image was "
                  "shrunk once before its crop)")
        if psnr_min_db is None or psnr_min_db < psnr_threshold_db:
            rec, reason = "leave off", reason + "; but its pixels differ beyond the tolerance"
        elif batched_recommendation != "enable":
            rec, reason = "leave off", reason + "; but it feeds the batched pipeline, which is left off here"
        elif cmp.ci_low > SPEEDUP_THRESHOLD:
            rec = "enable"
        else:
            rec, reason = "leave off", reason + f"; not measurably faster (threshold {SPEEDUP_THRESHOLD}x)"
    action = Action("dataset_cache", rec == "enable", f"decode-once dataset cache: {rec}", current=False)
    return {"recommendation": rec, "reason": reason, "action": action.to_dict(), "build_s": build_s,
            "cache_mib": cache_mib, "psnr_min_db": psnr_min_db, **fig}


def verdict(pre: Comparison, eff: Comparison, *, min_psnr_db: float, psnr_min_db: float, pixels_ok: bool,
            tokenize_share: float, batch_size: int, image_size: int, images: int, repeats: int, warmup: int,
            threads: int, device_kind: str, cache: dict[str, Any] | None = None) -> Verdict:
    """Notebook 02's verdict: enable batched decode when it is measurably faster and its pixels match.

    Parameters
    ----------
    pre : helpers.timing.Comparison
        :meth:`DecodeBench.compare_preprocess` (per-image baseline as A, batched + device normalize as B).
    eff : helpers.timing.Comparison
        :meth:`DecodeBench.compare_raw_decode` (raw decode only as A, batched host batch as B).
    min_psnr_db, psnr_min_db : float
        Worst PSNR of the batched pixels against the reference, and the least that counts as equal (dB).
    pixels_ok : bool
        Every checked image matched within the tolerance.
    tokenize_share : float
        Tokenization's share of a batched host batch's time (0..1).
    batch_size, image_size, images, repeats, warmup, threads : int
        What was measured (for the context sentence).
    device_kind : str
    cache : dict, optional
        :func:`cache_decision`: kept as ``extra["dataset_cache"]`` (notebook 10 enables the cache from it) and
        its reason appended.

    Returns
    -------
    helpers.verdict.Verdict
        metric ``speedup`` (x) of ``pre``, with its 95% interval; action on ``batched_decode``.
    """
    recommendation = batched_recommendation(pre, True)
    reason = (f"{pre.b.name} prepared {pre.ratio:.2f}x the images per second of the {pre.a.name} "
              f"(95% CI {pre.ci_low:.2f}-{pre.ci_high:.2f}; {pre.b.rate:,.0f} vs {pre.a.rate:,.0f} images/s); "
              f"decode efficiency {eff.ratio:.0%} (95% CI {eff.ci_low:.0%}-{eff.ci_high:.0%}; {eff.b.name} "
              f"{eff.b.rate:,.0f} vs {eff.a.name} {eff.a.rate:,.0f} images/s, a separate interleaved comparison); "
              f"pixels matched the reference with PSNR >= {min_psnr_db:.1f} dB (threshold {psnr_min_db:g} dB); "
              f"tokenization was {tokenize_share:.1%} of a {eff.b.name} batch's time")
    if not pixels_ok:
        recommendation = "leave off"
        reason += "; but some images differ from the reference beyond the tolerance: check the worst files above"
    context = (f"{batch_size} images of {image_size} px per batch from {images} images, {repeats} "
               f"timed batches per variant after {warmup} warm-up, interleaved, on {device_kind}; "
               f"{pre.b.name} = BatchedDataset ({threads} decode threads, libjpeg-turbo via simplejpeg with DCT "
               f"scaling) + to_device_batch; {eff.b.name} = BatchedDataset alone; {eff.a.name} = the same decoder, "
               f"scales and threads on bytes in memory; {pre.a.name} = BaselineDataset items + collate_batch + copy")
    action = Action("batched_decode", recommendation == "enable", f"batched decode + device normalize: {recommendation}",
                    current=False)
    extra = {"decision_threshold": SPEEDUP_THRESHOLD}  # the interval's lower bound must clear it to enable
    if cache is not None:
        reason += f"; decode once: {cache['recommendation']}: {cache['reason']}"
        extra["dataset_cache"] = dict(cache)
    return Verdict(notebook=NOTEBOOK, metric="speedup", value=pre.ratio, unit="x", recommendation=recommendation,
                   reason=reason, context=context, repeats=pre.b.repeats, action=action,
                   spread={"ci_low": pre.ci_low, "ci_high": pre.ci_high, "confidence": pre.confidence}, extra=extra)


# --------------------------------------------------------------------------- the notebook's run and its result


@dataclass(frozen=True)
class CacheOutcome:
    """The decode-once cache as notebook 02 measured it (section 9).

    Attributes
    ----------
    cmp : helpers.timing.Comparison or None
        :meth:`DecodeBench.compare_cache`; None when not measured (``why`` says why).
    psnr : tuple of float
        PSNR (dB) of the cached crops against the per-image reference, one per checked image.
    images, failed : int
        Images in the cache and files that could not be decoded.
    mib : float
        Its size on disk, MiB.
    build_s : float or None
        Seconds this run spent building it (None: already built).
    rebuilt_because : str
        Why it was (re)built.
    why : str
        Why it was not measured (empty when it was).
    """

    cmp: Comparison | None = None
    psnr: tuple[float, ...] = ()
    images: int = 0
    failed: int = 0
    mib: float = 0.0
    build_s: float | None = None
    rebuilt_because: str = ""
    why: str = ""


@dataclass(frozen=True, eq=False)
class DecodeChecks(DecodeChecksTexts):
    """Notebook 02 before any timing (:func:`check`, sections 1-3): the data, the decode plans, the pixels against
    the per-image reference, the fixtures and the mid-epoch probe. :class:`DecodeResult` extends it with the
    measurement.

    Attributes
    ----------
    params : mapping
        The notebook's validated parameters.
    device_kind : str
    images, skipped, classes : int
        Usable images, files skipped by the scan, classes.
    source : str
        ``"embedded"`` or ``"user folder"``.
    threads, cores : int
        Decode threads of the batched pipeline and usable cores.
    pinned : bool
        Whether the batch buffers are pinned.
    pinned_note : str
        Why pinned memory is unavailable (empty where it is).
    dct_scaling : bool
        The pipeline's DCT scaling setting.
    n_plans : int
        Images planned over one epoch.
    scales : dict
        DCT denominator (1, 2, 4, 8) -> images of the libjpeg-turbo route decoded at it.
    full_px, decoded_px : int
        Pixels of a full-resolution decode and pixels the decoder produces, over the turbo-route images.
    check : pandas.DataFrame
        :func:`helpers.pipeline.fast.reference_check` of the first two batches (``psnr_db`` per image).
    model_input : str
        Shape, dtype and PSNR of the normalized batch against the baseline's.
    routes : pandas.DataFrame
        :func:`helpers.pipeline.decode.compare_routes` of the fixtures, with ``same picture``.
    mid_epoch : str
        What the truncated-file probe's batch reported.
    index, tokenizer
        The images and tokenizer (for the try-it panel).
    dataset, bench
        What :func:`run` times next: the batched dataset (its decode threads; :func:`run` closes it) and the
        :class:`DecodeBench` over it (keyword-only, None in a result).
    """

    params: Mapping[str, Any]
    device_kind: str
    images: int
    skipped: int
    classes: int
    source: str
    threads: int
    cores: int
    pinned: bool
    pinned_note: str
    dct_scaling: bool
    n_plans: int
    scales: Mapping[int, int]
    full_px: int
    decoded_px: int
    check: Any
    model_input: str
    routes: Any
    mid_epoch: str
    index: Any = field(default=None, compare=False, repr=False)
    tokenizer: Any = field(default=None, compare=False, repr=False)
    dataset: Any = field(default=None, compare=False, repr=False, kw_only=True)
    bench: Any = field(default=None, compare=False, repr=False, kw_only=True)

    @property
    def pixel_fraction(self) -> float | None:
        """Decoded pixels over a full-resolution decode, turbo route only (None: no turbo-route image)."""
        return self.decoded_px / self.full_px if self.full_px else None

    @property
    def psnr_values(self) -> list[float]:
        """PSNR (dB) of each checked batched image against the reference."""
        return self.check["psnr_db"].dropna().tolist()

    @property
    def min_psnr(self) -> float:
        """Worst PSNR of the checked images, dB."""
        return min(self.psnr_values)

    @property
    def pixels_ok(self) -> bool:
        """Every checked image within ``psnr_min_db``."""
        return self.min_psnr >= self.params["psnr_min_db"]

    @property
    def worst(self):
        """The five checked images of lowest PSNR (a DataFrame)."""
        return self.check.sort_values("psnr_db").head(5)


@dataclass(frozen=True, eq=False)
class DecodeResult(DecodeChecks, DecodeResultTexts, ExperimentResult):
    """Everything notebook 02 measured: :class:`DecodeChecks` (sections 1-3), then the interleaved comparisons, the
    cache and GPU decode.

    Attributes
    ----------
    params, device_kind, images, skipped, classes, source, threads, cores, pinned, pinned_note, dct_scaling, n_plans
        As :class:`DecodeChecks`'s, and so are ``scales``, ``full_px``, ``decoded_px``, ``check``, ``model_input``,
        ``routes``, ``mid_epoch``, ``index`` and ``tokenizer`` (with their texts).
    gil : Comparison or None
        1 thread vs the pool (None with one decode thread).
    flags : Comparison
        Default decoder vs fastdct + fastupsample; ``flag_psnr``: their worst PSNR, dB.
    pre, eff, tok : Comparison
        Preprocessing speedup, decode efficiency, tokenization.
    share : dict
        :meth:`DecodeBench.tokenize_share`.
    cache : CacheOutcome
    gpu : Comparison or None
        GPU decode (``gpu_psnr``: its PSNRs; ``gpu_why``: why not measured).
    npu_note : str
        :func:`helpers.pipeline.decode.npu_decode_note`.
    ran : dict or None
        :func:`helpers.conditions.ran_with` read while the comparisons ran (torch threads, images per batch): both
        sides of every comparison ran in one process with them (the decode threads of the ``gil`` comparison are its
        change, not torch's); None where not stated.
    """

    _: KW_ONLY
    gil: Comparison | None
    flags: Comparison
    flag_psnr: float
    pre: Comparison
    eff: Comparison
    tok: Comparison
    share: Mapping[str, float]
    cache: CacheOutcome
    gpu: Comparison | None
    gpu_psnr: tuple[float, ...]
    gpu_why: str
    npu_note: str
    ran: Mapping[str, Any] | None = None

    @property
    def adopt_flags(self) -> bool:
        """fastdct + fastupsample measurably faster (interval above 1.05) and within the PSNR tolerance."""
        return self.flags.ci_low > 1.05 and self.flag_psnr >= self.params["psnr_min_db"]

    # -- records and verdict ----------------------------------------------------------------------------------
    def records(self) -> Records:
        """The records of notebook 02, in its sections' order (dataset, dct scaling, correctness, gil, decoder
        flags, preprocess, decode efficiency, tokenize, dataset cache, gpu decode, npu decode); each comparison with
        the torch threads and batch of both sides (:func:`helpers.conditions.sides`), each timed variant with its
        own."""
        r, p, check, alike, ran = Records(), self.params, self.check, sides(self.ran, self.ran), self.ran or {}
        r.add("dataset", "usable images", "images", self.images, "images", skipped=self.skipped, classes=self.classes,
              source=self.source)
        r.add("dct scaling", "epoch 0", "decoded_pixel_fraction", self.pixel_fraction, "fraction",
              counts={f"1/{d}": self.scales.get(d, 0) for d in (1, 2, 4, 8)})
        r.add("correctness", "batched vs reference", "psnr_min", self.min_psnr, "dB", repeats=len(self.psnr_values),
              spread={"p10": float(check["psnr_db"].quantile(0.10)), "median": float(check["psnr_db"].median())},
              threshold_db=p["psnr_min_db"], passed=bool(self.pixels_ok))
        routes = self.routes
        r.add("correctness", "fixtures", "fixtures_consistent", int(routes["agree"].sum()), "files", total=len(routes),
              rejected=int((routes["route"] == "rejected").sum()),
              reference_route=int((routes["route"] == "reference").sum()))
        if self.gil is not None:
            r.add_comparison("gil", self.gil, metric="thread_speedup", unit="x", threads=self.threads, **alike)
        else:
            r.add("gil", "1 vs N threads", "thread_speedup", None, "x", recommendation="not applicable",
                  reason=_ONE_THREAD)
        r.add_comparison("decoder flags", self.flags, metric="speedup", unit="x", psnr_min_db=float(self.flag_psnr),
                         **alike)
        pre, eff = self.pre, self.eff
        r.add_comparison("preprocess", pre, metric="speedup", unit="x", threads=self.threads, **alike)
        for m in (pre.a, pre.b):
            r.add_measurement("preprocess", m.name, m, metric="time_per_batch", unit="s", rate_metric="throughput",
                              rate_unit="images/s", **ran)
        r.add("decode efficiency", f"{eff.b.name} vs {eff.a.name}", "decode_efficiency", eff.ratio, "fraction",
              repeats=min(eff.a.repeats, eff.b.repeats),
              spread={"ci_low": eff.ci_low, "ci_high": eff.ci_high, "confidence": eff.confidence},
              raw_decode_rate=eff.a.rate, batched_host_rate=eff.b.rate, **alike)
        for m in (eff.a, eff.b):
            r.add_measurement("decode efficiency", m.name, m, metric="time_per_batch", unit="s",
                              rate_metric="throughput", rate_unit="images/s", **ran)
        self._later_records(r)
        return r

    def _later_records(self, r: Records) -> None:
        s, c, alike = self.share, self.cache, sides(self.ran, self.ran)
        r.add_comparison("tokenize", self.tok, metric="tokenize_speedup", unit="x", **alike)
        r.add("tokenize", self.eff.b.name, "tokenize_share", s["batched_share"], "fraction",
              tokenize_s=s["tokenize_batch_s"], batch_s=s["host_s"])
        r.add("tokenize", self.pre.a.name, "tokenize_share", s["per_sample_share"], "fraction",
              tokenize_s=s["tokenize_per_sample_s"], batch_s=s["baseline_s"])
        if c.cmp is not None:
            r.add("dataset cache", "decode-once cache", "cache_size", c.mib, "MiB", images=c.images, failed=c.failed,
                  build_s=c.build_s)
            r.add_comparison("dataset cache", c.cmp, metric="speedup", unit="x", psnr_min_db=min(c.psnr), **alike)
        else:
            r.add("dataset cache", "decode-once cache", "speedup", None, "x", recommendation="not applicable",
                  reason=c.why)
        if self.gpu is not None:
            r.add_comparison("gpu decode", self.gpu, metric="speedup", unit="x", psnr_min_db=min(self.gpu_psnr),
                             **alike)
        else:
            r.add("gpu decode", "torchvision nvjpeg", "speedup", None, "x", recommendation="not applicable",
                  reason=self.gpu_why)
        if self.device_kind == "npu":
            r.add("npu decode", "DVPP", "speedup", None, "x", recommendation="not applicable",
                  reason="not verified: " + self.npu_note)

    def cache_decision(self) -> dict[str, Any]:
        """The decode-once cache's own decision (:func:`cache_decision`), kept as ``extra["dataset_cache"]``."""
        c = self.cache
        return cache_decision(c.cmp, batched_recommendation=batched_recommendation(self.pre, self.pixels_ok),
                              build_s=c.build_s if c.cmp is not None else None, cache_mib=c.mib,
                              psnr_min_db=min(c.psnr) if c.psnr else None,
                              psnr_threshold_db=self.params["psnr_min_db"], why_not=c.why)

    def verdict(self) -> Verdict:
        """Notebook 02's verdict (:func:`verdict`), with the cache's decision."""
        p = self.params
        return verdict(self.pre, self.eff, min_psnr_db=self.min_psnr, psnr_min_db=p["psnr_min_db"],
                       pixels_ok=self.pixels_ok, tokenize_share=self.share["batched_share"],
                       batch_size=p["batch_size"], image_size=p["image_size"], images=self.images,
                       repeats=p["repeats"], warmup=p["warmup"], threads=self.threads, device_kind=self.device_kind,
                       cache=self.cache_decision())

    # -- try it -----------------------------------------------------------------------------------------------
    def try_it(self, acc, params: Mapping[str, Any]) -> TrySpec:
        """The try-it panel: the batched pipeline at other decode threads, DCT scaling and crop size.

        Parameters
        ----------
        acc : helpers.device.Accelerator
        params : mapping
            The notebook's parameters (``threads``, ``image_size``, ``repeats``, ``warmup``, ``batch_size``).

        Returns
        -------
        helpers.live.TrySpec
            Knobs ``threads``, ``dct_scaling`` (a checkbox), ``image_size``; reference: the notebook's
            batched + device normalize rate.
        """
        p, n = params, self.cores
        threads = ((f"0 (all {n} usable cores)", 0),) + tuple(
            (str(t), t) for t in sorted({1, 2, n, 2 * n, p["threads"]} - {0}))
        sizes = tuple((str(s), s) for s in sorted({32, 64, 96, 128, 224, p["image_size"]}))
        knobs = {"threads": Knob(threads, p["threads"], "threads"), "dct_scaling": self.dct_scaling,
                 "image_size": Knob(sizes, p["image_size"], "image_size")}
        label = (f"threads={p['threads']}" + (f" (={self.threads})" if p["threads"] == 0 else "")
                 + f", DCT {'on' if self.dct_scaling else 'off'}, {p['image_size']}px")
        index, tokenizer = self.index, self.tokenizer

        def measure(progress=no_progress, **k):
            return try_decode(p, acc, index, tokenizer, repeats=min(p["repeats"], 10), warmup=min(p["warmup"], 2),
                              progress=progress, **k)

        return TrySpec("batched decode at other threads, DCT scaling and crop size", measure, knobs,
                       reference=live_point(self.pre.b, label, batch_size=p["batch_size"],
                                            pixel_fraction=self.pixel_fraction))


def _check_fixtures(dataset: BatchedDataset, psnr_min_db: float):
    """The fixtures on both decode paths, asserted alike, and their channel order (notebook 02, section 3)."""
    from helpers.pipeline.decode import compare_routes, corner_colours, fixtures_dir
    from helpers.pipeline.images import IMAGE_SUFFIXES

    fixtures = fixtures_dir()
    if fixtures is None:
        raise FileNotFoundError("data/fixtures is not here: run this notebook from a checkout of the workbook "
                                "repository")
    files = sorted(p for p in fixtures.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
    routes = compare_routes(files, transform=dataset.transform)
    routes["same picture"] = routes["psnr_db"].apply(lambda v: "n/a" if v != v else bool(v >= psnr_min_db))
    assert routes["agree"].all(), routes[~routes["agree"]]
    assert (routes["same picture"] != False).all(), routes[routes["same picture"] == False]  # noqa: E712
    colours = {name: corner_colours(fixtures / name) for name in ("rgb_patches.jpg", "cmyk.jpg",
                                                                 "exif_orientation6.jpg", "rgb16.png")}
    assert all(c == {"top-left": "red", "top-right": "green", "bottom-left": "blue"} for c in colours.values()), colours
    return routes, fixtures


def _model_input(bench: DecodeBench, acc) -> str:
    """The normalized batch of both pipelines compared, as the model sees it (tokens and labels asserted equal)."""
    import torch

    from helpers.pipeline.baseline import IMAGENET_MEAN, IMAGENET_STD

    first = bench.batches[0]
    fast_x, fast_tokens, fast_labels = to_device_batch(bench.dataset[first], acc)
    base_x, base_tokens, base_labels = host_to_device(collate_batch([bench.baseline[i] for i in first]), acc)
    assert torch.equal(fast_tokens.cpu(), base_tokens.cpu()) and torch.equal(fast_labels.cpu(), base_labels.cpu())
    std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    mean = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)

    def to_pixels(x):
        return ((x.float().cpu() * std + mean) * 255).numpy()

    return (f"model input, batched vs baseline: same shape {tuple(fast_x.shape)}, dtype {fast_x.dtype}, "
            f"tokens and labels identical, PSNR {psnr(to_pixels(fast_x), to_pixels(base_x)):.1f} dB")


def _mid_epoch(index, tokenizer, fixtures, p: Mapping[str, Any], expect) -> str:
    """A truncated JPEG slipped into the index: reported and replaced in its batch (notebook 02, section 3)."""
    import numpy as np

    from helpers.pipeline.dataset import DatasetIndex

    paths = index.paths.copy().astype(object)
    paths[1] = str(fixtures / "truncated.jpg")
    damaged = DatasetIndex(root=index.root, paths=np.array(paths, dtype=np.str_), captions=index.captions,
                           labels=index.labels, n_classes=index.n_classes)
    probe = BatchedDataset(damaged, tokenizer, image_size=p["image_size"], text_len=p["text_len"], seed=p["seed"],
                           threads=1)
    with expect("the truncated JPEG is reported and replaced in its batch, on purpose"):
        batch = probe[[0, 1, 2, 3]]
    assert batch["image"].shape[0] == 4 and int(batch["label"][1]) == int(damaged.labels[2])
    return (f"batch of {batch['image'].shape[0]} images, skipped: {batch['skipped']}; slot 1 now holds item 2, "
            "the next item that decodes, with its own label and caption")


def _measure_cache(bench: DecodeBench, index, tokenizer, p: Mapping[str, Any]) -> CacheOutcome:
    """The decode-once cache opened (built on first use), checked against the reference and timed (section 9)."""
    from helpers.errors import DataError
    from helpers.pipeline.baseline import ImageTransformConfig
    from helpers.pipeline.image_cache import CachedDataset, open_image_cache

    if not p["dataset_cache"]:
        return CacheOutcome(why="the parameter dataset_cache is off")
    try:
        cache, info = open_image_cache(index, ImageTransformConfig(image_size=p["image_size"]),
                                       max_bytes=p["max_cache_mib"] << 20, threads=p["threads"])
    except DataError as exc:  # over the size bound: said, and the batched decode stands alone
        return CacheOutcome(why=str(exc))
    cached = CachedDataset(index, tokenizer, cache=cache, image_size=p["image_size"], text_len=p["text_len"],
                           seed=p["seed"], threads=p["threads"])
    try:
        quality = bench.cache_psnr(cached)  # the cached crops against the per-image reference
        cmp = bench.compare_cache(cached)
    finally:
        cached.close()
    return CacheOutcome(cmp=cmp, psnr=tuple(quality), images=info.images, failed=len(info.failed),
                        mib=info.bytes / 2**20, build_s=info.build_s, rebuilt_because=str(info.rebuilt_because))


def check(params: Mapping[str, Any], acc, *, expect: Callable[..., Any] = no_expected_warnings) -> DecodeChecks:
    """Notebook 02 before any timing (sections 1-3): the data, the decode plans, the pixels against the per-image
    reference, the fixtures and the mid-epoch probe; seconds where :func:`run` times for a minute.

    Parameters
    ----------
    params : mapping
        Notebook 02's validated parameters.
    acc : helpers.device.Accelerator
    expect : callable, optional
        ``expect(why, match=None)``: a context manager around work that warns on purpose (the notebook passes
        :func:`helpers.workbook.output.expected_warnings`); default: none.

    Returns
    -------
    DecodeChecks
        With the open batched dataset and its :class:`DecodeBench`, which :func:`run` times and then closes.

    Raises
    ------
    helpers.errors.DataError
        If the images do not fill one batch.
    AssertionError
        If a check of the pixels, the fixtures or the truncated-file probe fails.
    FileNotFoundError
        Without ``data/fixtures`` (not a checkout of the workbook).
    """
    from helpers.pipeline.decode import usable_cores
    from helpers.pipeline.fast import reference_check

    p = params
    index, tokenizer = prepare_data(p["data_dir"] or None, max_images=p["max_images"], seed=p["seed"],
                                    batch_size=p["batch_size"], text_len=p["text_len"])
    pin = acc.capabilities.pinned_memory
    dataset = BatchedDataset(index, tokenizer, image_size=p["image_size"], text_len=p["text_len"], seed=p["seed"],
                             threads=p["threads"], pin_memory=pin.available)
    try:
        bench = DecodeBench(dataset, acc, batch_size=p["batch_size"], repeats=p["repeats"], warmup=p["warmup"],
                            seed=p["seed"])
        plans = dataset.decode_plan(range(len(dataset)))
        turbo = [q for q in plans if q.route == "turbo"]
        import pandas as pd

        pixels = pd.concat([reference_check(dataset, b) for b in bench.batches[:2]], ignore_index=True)
        model_input = _model_input(bench, acc)
        routes, fixtures = _check_fixtures(dataset, p["psnr_min_db"])
        mid_epoch = _mid_epoch(index, tokenizer, fixtures, p, expect)
    except BaseException:
        dataset.close()
        raise
    return DecodeChecks(
        params=dict(p), device_kind=acc.kind, images=len(index), skipped=len(index.skipped), classes=index.n_classes,
        source=p["data_dir"] and "user folder" or "embedded", threads=dataset.threads, cores=usable_cores(),
        pinned=dataset.pinned, pinned_note="" if pin.available else str(pin), dct_scaling=dataset.decode.dct_scaling,
        n_plans=len(plans), scales=dict(Counter(q.denominator for q in turbo)),
        full_px=sum(q.header.stored_height * q.header.stored_width for q in turbo),
        decoded_px=sum(math.ceil(q.header.stored_height / q.denominator)
                       * math.ceil(q.header.stored_width / q.denominator) for q in turbo),
        check=pixels, model_input=model_input, routes=routes, mid_epoch=mid_epoch, index=index, tokenizer=tokenizer,
        dataset=dataset, bench=bench)


def run(params: Mapping[str, Any], acc, checks: DecodeChecks | None = None, *,
        expect: Callable[..., Any] = no_expected_warnings) -> DecodeResult:
    """Notebook 02's whole measurement: :func:`check` (plans, pixel checks), then the interleaved comparisons, the
    cache and GPU decode.

    Parameters
    ----------
    params : mapping
        Notebook 02's validated parameters.
    acc : helpers.device.Accelerator
    checks : DecodeChecks, optional
        :func:`check`'s result (the notebook shows it before the timing starts); None checks here. Its dataset is
        closed on the way out.
    expect : callable, optional
        ``expect(why, match=None)``: a context manager around work that warns on purpose (the notebook passes
        :func:`helpers.workbook.output.expected_warnings`); default: none.

    Returns
    -------
    DecodeResult

    Raises
    ------
    helpers.errors.DataError, AssertionError, FileNotFoundError
        As :func:`check` (called here when ``checks`` is None).
    """
    from helpers.pipeline.decode import npu_decode_note
    from helpers.pipeline.fast import reference_check

    p = params
    c = checks if checks is not None else check(params, acc, expect=expect)
    dataset, bench, index, tokenizer = c.dataset, c.bench, c.index, c.tokenizer
    try:
        ran = ran_with(p["batch_size"])  # read as the comparisons start: nothing below sets torch's threads
        gil = bench.compare_threads(1) if dataset.threads > 1 else None
        flags = DecodeConfig(fastdct=True, fastupsample=True)
        flag_dataset = BatchedDataset(index, tokenizer, image_size=p["image_size"], text_len=p["text_len"],
                                      seed=p["seed"], threads=p["threads"], decode=flags)
        try:
            flag_psnr = float(reference_check(flag_dataset, bench.batches[0])["psnr_db"].min())
            flag_cmp = bench.compare_decoder_flags(flags)
        finally:
            flag_dataset.close()
        pre, eff = bench.compare_preprocess(), bench.compare_raw_decode()
        tok = bench.compare_tokenize()
        share = bench.tokenize_share(host_s=eff.b.median_s, baseline_s=pre.a.median_s)
        cache = _measure_cache(bench, index, tokenizer, p)
        gpu_ok, gpu_why = cuda_decode_support(acc)
        gpu, gpu_psnr = bench.compare_gpu_decode() if gpu_ok else (None, ())
        return DecodeResult(**{**checked_fields(c), "dataset": None, "bench": None}, gil=gil, flags=flag_cmp,
                            flag_psnr=flag_psnr, pre=pre, eff=eff, tok=tok, share=share, cache=cache, gpu=gpu,
                            gpu_psnr=tuple(gpu_psnr), gpu_why="" if gpu_ok else gpu_why, npu_note=npu_decode_note(),
                            ran=held(ran))
    finally:
        dataset.close()


# -- the notebook's declaration, found by helpers.experiments.registry ------------------------------------

EXPERIMENT = Experiment(
    item=Item("02", "02_batched_decode", "batched decode",
         "Decode a whole batch at once, on every core",
         "How much faster is decoding a whole batch on a thread pool than per-image PIL, or once for all epochs?",
         ("batched_decode", "dataset_cache")),
    spec=specs.COMMON + specs.DATA + specs.batch("images per batch") + (
        Param("threads", int, 0, "decode threads of the batched pipeline (0 for all usable cores)",
              minimum=0, maximum=256),
        Param("repeats", int, 10, "timed batches per variant", minimum=3, maximum=10000),
        Param("warmup", int, 2, "untimed batches per variant before timing", minimum=0, maximum=100),
        Param("psnr_min_db", float, 30.0, "least PSNR of batched vs reference pixels to call them equal",
              minimum=10.0, maximum=100.0),
        Param("dataset_cache", bool, True, "also measure the decode-once dataset cache (built on disk on first use)"),
        Param("max_cache_mib", int, 2048, "largest decode-once cache to build, MiB", minimum=1, maximum=1 << 22),
    ),
    optimizations=(
        Optimization("batched_decode", "02_batched_decode", ("data", "h2d"),
                     default=lambda acc, native_bf16=None: (
                         True, "batched decode replaces per-image Pillow work on every device"),
                     apply=lambda plan, settings, acc: replace(plan, pipeline="batched")),
        Optimization("dataset_cache", "02_batched_decode", ("data", "h2d"), decision="dataset_cache",
                     requires="batched_decode",
                     default=lambda acc, native_bf16=None: (
                         False, "it writes a decoded copy of the dataset to disk: on only where notebook 02 "
                                "measured it faster"),
                     # the cache feeds the batched pipeline (``requires``): it replaces that pipeline's decodes
                     apply=lambda plan, settings, acc: replace(plan, pipeline="cached")),
    ),
    interleaved_repeats="repeats",
)
