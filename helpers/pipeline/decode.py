"""Fast image decode for batched preprocessing: libjpeg-turbo with DCT-domain scaling.

The baseline pipeline (:mod:`helpers.pipeline.baseline`) decodes every JPEG
at full resolution with Pillow, then crops a random box and resizes it down
to ``S x S``. Most of the decoded pixels are thrown away. This module does the
same job faster, and checks that it gives the same pixels:

1. **Read the header only** (libjpeg-turbo's header parser, about 1 us; no
   pixel is decoded): stored size and colour space; the EXIF orientation is
   read with Pillow, only for files that carry an EXIF segment.
2. **Draw the same crop and flip as the baseline**: the upright size is known
   from the header, so :func:`helpers.pipeline.baseline.sample_augment` with
   :func:`helpers.pipeline.baseline.item_generator` gives exactly the box the
   baseline draws for the same ``(seed, epoch, index)``.
3. **Decode at reduced size** with libjpeg-turbo through ``simplejpeg``
   (``decode_jpeg(..., min_height, min_width, min_factor)``). libjpeg-turbo can
   run its inverse DCT on 8x8 blocks at 1/2, 1/4 or 1/8 scale (the fast,
   SIMD-accelerated factors; "factors smaller than 2 may take longer to
   decode", simplejpeg's docstring). The largest factor is chosen for which the
   crop, once reduced, is still at least ``S`` pixels on both sides
   (:func:`choose_dct_denominator`), so the final resize still only shrinks.
   The decoder releases the GIL, so a thread pool decodes a batch in parallel.
4. **Orient, crop, resize, flip on uint8**: the EXIF orientation is applied as
   NumPy views (no copy), only the crop region is copied, Pillow resizes it
   (bilinear with antialiasing, as the baseline; Pillow releases the GIL while
   resampling) with the crop box mapped to sub-pixel precision into the
   reduced image, and the flip is a view. The result is written straight into
   the caller's slot of a batch buffer.

Steps 1-2 are cheap Python (:func:`plan_decode`); steps 3-4 are the heavy
part and release the GIL (:func:`run_plan`), so a batch plans all its images
in the calling thread while a pool decodes them.

Every file the fast path cannot decode *identically in meaning* goes to the
reference path (:func:`helpers.pipeline.images.load_rgb`, then the same crop,
resize and flip), and the route taken is returned so that it can be counted:

=========================  ==================================================
input                      route
=========================  ==================================================
baseline/progressive JPEG  ``turbo`` (RGB out, grey replicated by libjpeg-turbo)
grey JPEG                  ``turbo`` (libjpeg-turbo replicates Y into R, G, B)
CMYK / YCCK JPEG           ``reference``: libjpeg-turbo cannot convert CMYK to
                           RGB; Pillow reads Adobe's inverted CMYK correctly
PNG, 16-bit, palette,      ``reference`` (not a JPEG)
alpha, TIFF, ...
JPEG simplejpeg rejects    ``reference``, which raises
(truncated, corrupt)       :class:`~helpers.pipeline.images.BadImage` with the
                           reason when Pillow cannot decode it either
=========================  ==================================================

Channel order is RGB on every route (OpenCV decodes to BGR:
https://docs.opencv.org/4.x/d4/da8/group__imgcodecs.html); EXIF orientation is
applied on every route (simplejpeg ignores EXIF, so it is read from the
header and applied here), with the same 8 transforms as
``PIL.ImageOps.exif_transpose``.

Tolerance: with ``dct_scaling=False`` the fast route is the reference to within
the rounding of two builds of libjpeg-turbo (max error of a few levels);
with DCT scaling, the reduced decode replaces part of the bilinear
downscale, so pixels differ slightly; :func:`psnr` against
:func:`reference_augment` is the check (notebook 02's ``psnr_min_db``,
30 dB by default).
"""

from __future__ import annotations

import io
import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from helpers.device import usable_cores  # noqa: F401  (re-exported)
from helpers.errors import DeviceUnavailableError, ParameterError
from helpers.pipeline.baseline import (
    AugmentParams,
    ImageTransformConfig,
    item_generator,
    sample_augment,
)
from helpers.pipeline.images import BadImage, load_rgb

if TYPE_CHECKING:  # pragma: no cover - typing only
    import torch

logger = logging.getLogger(__name__)

__all__ = [
    "DCT_DENOMINATORS",
    "EXIF_ORIENTATION_TAG",
    "DecodeConfig",
    "JpegHeader",
    "DecodeResult",
    "DecodePlan",
    "read_header",
    "plan_decode",
    "run_plan",
    "apply_orientation",
    "choose_dct_denominator",
    "decode_jpeg_scaled",
    "decode_augment",
    "reference_augment",
    "psnr",
    "fixtures_dir",
    "compare_routes",
    "corner_colours",
    "usable_cores",
    "cuda_decode_support",
    "decode_augment_cuda",
    "npu_decode_note",
]

#: Scale denominators used for DCT-domain downscaling: libjpeg-turbo's
#: SIMD-accelerated inverse DCTs reduce by 2, 4 and 8 (libjpeg-turbo
#: documentation, ``tjGetScalingFactors``; simplejpeg's ``min_factor``
#: docstring warns that factors below 2 are slower).
DCT_DENOMINATORS: tuple[int, ...] = (8, 4, 2, 1)

#: EXIF tag number of the image orientation (EXIF 2.32, section 4.6.4, tag 274).
EXIF_ORIENTATION_TAG = 0x0112

#: JPEG start-of-image marker followed by the first marker's 0xFF.
_JPEG_MAGIC = b"\xff\xd8\xff"

# Per EXIF orientation: (swap axes, upright y reversed w.r.t. stored, upright x reversed).
# Stored S, upright U; derived from the NumPy ops in _ORIENT below and checked
# against PIL.ImageOps.exif_transpose in tests/test_decode.py.
_AXES: dict[int, tuple[bool, bool, bool]] = {
    1: (False, False, False),
    2: (False, False, True),
    3: (False, True, True),
    4: (False, True, False),
    5: (True, False, False),
    6: (True, False, True),
    7: (True, True, True),
    8: (True, True, False),
}


@dataclass(frozen=True)
class DecodeConfig:
    """How the fast path decodes.

    Attributes
    ----------
    dct_scaling : bool, default True
        Decode JPEGs at 1/2, 1/4 or 1/8 size when the crop stays at least
        ``margin * S`` pixels on both sides.
    fastdct : bool, default False
        libjpeg-turbo's fast integer inverse DCT (simplejpeg: "speeds up
        decoding by 4-5% for a minor loss in quality"). Off unless measured
        acceptable against the PSNR tolerance (notebook 02 measures it).
    fastupsample : bool, default False
        Nearest-neighbour chroma upsampling instead of the "fancy" (smooth)
        one; same trade-off as ``fastdct``.
    max_denominator : int, default 8
        Largest reduction allowed, one of 1, 2, 4, 8 (1 disables scaling).
    margin : float, default 1.0
        The reduced crop must be at least ``margin * S`` on both sides
        (>= 1.0; larger keeps more detail for the final resize).

    Raises
    ------
    ParameterError
        For a ``max_denominator`` not in (1, 2, 4, 8) or a ``margin`` < 1.
    """

    dct_scaling: bool = True
    fastdct: bool = False
    fastupsample: bool = False
    max_denominator: int = 8
    margin: float = 1.0

    def __post_init__(self) -> None:
        if self.max_denominator not in DCT_DENOMINATORS or isinstance(self.max_denominator, bool):
            raise ParameterError(
                f"max_denominator must be one of 1, 2, 4, 8 (libjpeg-turbo's fast scales), got "
                f"{self.max_denominator!r}"
            )
        if not (isinstance(self.margin, (int, float)) and math.isfinite(self.margin) and self.margin >= 1.0):
            raise ParameterError(
                f"margin must be a number >= 1.0 (the reduced crop must still cover the output), got {self.margin!r}"
            )


@dataclass(frozen=True)
class JpegHeader:
    """What the header of a JPEG says, before any pixel is decoded.

    Attributes
    ----------
    colorspace : str
        libjpeg-turbo's colour space of the file: ``"YCbCr"``, ``"Gray"``,
        ``"RGB"``, ``"CMYK"`` or ``"YCCK"``.
    stored_height, stored_width : int
        Pixel size as stored in the file.
    orientation : int
        EXIF orientation, 1 (none) to 8; 1 when absent or invalid.
    """

    colorspace: str
    stored_height: int
    stored_width: int
    orientation: int = 1

    @property
    def height(self) -> int:
        """Upright height in pixels (after the EXIF orientation)."""
        return self.stored_width if _AXES[self.orientation][0] else self.stored_height

    @property
    def width(self) -> int:
        """Upright width in pixels (after the EXIF orientation)."""
        return self.stored_height if _AXES[self.orientation][0] else self.stored_width

    @property
    def turbo_ok(self) -> bool:
        """True when libjpeg-turbo decodes this file to the reference RGB (colour or grey, not CMYK)."""
        return self.colorspace in _TURBO_COLORSPACES


#: libjpeg-turbo colour spaces whose RGB output equals the reference decode
#: (grey is replicated into R, G, B by libjpeg-turbo, as load_rgb does).
_TURBO_COLORSPACES = frozenset({"YCbCr", "Gray", "RGB"})


@dataclass(frozen=True)
class DecodeResult:
    """What :func:`decode_augment` did for one image.

    Attributes
    ----------
    image : numpy.ndarray
        (S, S, 3) uint8, RGB: the augmented image (the ``out`` array when one
        was given).
    route : str
        ``"turbo"`` (libjpeg-turbo via simplejpeg) or ``"reference"`` (Pillow).
    why : str
        Why the reference route was taken ("" for turbo), e.g.
        ``"CMYK JPEG: libjpeg-turbo cannot convert it to RGB"``.
    denominator : int
        DCT scale denominator used (1 = full size; always 1 on the reference route).
    params : AugmentParams
        The crop box (upright, full-resolution pixels) and the flip.
    height, width : int
        Upright full-resolution size of the source image.
    """

    image: np.ndarray
    route: str
    why: str
    denominator: int
    params: AugmentParams
    height: int
    width: int


@dataclass(frozen=True)
class DecodePlan:
    """Everything decided about one image before its pixels are decoded (see :func:`plan_decode`).

    Attributes
    ----------
    path : str
        The file.
    data : bytes
        Its bytes (empty when it could not be read).
    header : JpegHeader or None
        None on the reference route.
    params : AugmentParams or None
        Crop and flip (turbo route); on the reference route they are drawn
        after the decode, from the decoded size.
    denominator : int
        DCT scale denominator (turbo route), else 1.
    route, why : str
        ``"turbo"`` or ``"reference"``, and why the reference route.
    seed, epoch, index : int
        The item's generator key.
    """

    path: str
    data: bytes
    header: JpegHeader | None
    params: AugmentParams | None
    denominator: int
    route: str
    why: str
    seed: int
    epoch: int
    index: int


# --------------------------------------------------------------------------- small pieces


def _is_jpeg(data: bytes) -> bool:
    return data[:3] == _JPEG_MAGIC


def _exif_orientation(data: bytes) -> int:
    """EXIF orientation of a JPEG as Pillow reads it; 1 when there is no EXIF block."""
    sos = data.find(b"\xff\xda")
    if data.find(b"Exif\x00\x00", 0, sos if sos > 0 else len(data)) < 0:
        return 1  # no EXIF segment before the scan: nothing to orient (the common case, 1 us)
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as im:  # Pillow parses the markers (and the TIFF block) itself
            value = im.getexif().get(EXIF_ORIENTATION_TAG, 1)
    except Exception:  # noqa: BLE001 - an unreadable EXIF block: Pillow's exif_transpose would skip it too
        return 1
    # exif_transpose ignores anything but 2..8 (PIL/ImageOps.py); so do we
    return value if isinstance(value, int) and value in _AXES else 1


def read_header(data: bytes) -> JpegHeader | None:
    """Read colour space, stored size and EXIF orientation from a JPEG's bytes.

    libjpeg-turbo parses the header (``simplejpeg.decode_jpeg_header``, about
    1 us); the EXIF orientation is read with Pillow, and only when the file
    has an EXIF segment. Never raises for bad data.

    Parameters
    ----------
    data : bytes
        The whole file.

    Returns
    -------
    JpegHeader or None
        None when the data is not a JPEG or its header cannot be parsed (the
        reference path then names the problem).
    """
    import simplejpeg

    if not _is_jpeg(data):
        return None
    try:
        height, width, colorspace, _ = simplejpeg.decode_jpeg_header(data)
    except (ValueError, RuntimeError):
        return None
    return JpegHeader(colorspace=str(colorspace), stored_height=int(height), stored_width=int(width),
                      orientation=_exif_orientation(data))


def apply_orientation(arr: np.ndarray, orientation: int) -> np.ndarray:
    """Turn a stored image upright, as ``PIL.ImageOps.exif_transpose`` does, without copying.

    Parameters
    ----------
    arr : numpy.ndarray
        (H, W, C) or (H, W), as stored in the file.
    orientation : int
        EXIF orientation 1 to 8 (others are treated as 1, like Pillow).

    Returns
    -------
    numpy.ndarray
        A view of ``arr`` (negative or swapped strides): 1 as is; 2 mirror
        left-right; 3 rotate 180; 4 mirror top-bottom; 5 transpose; 6 rotate
        90 clockwise (Pillow's ROTATE_270); 7 transverse; 8 rotate 90
        counter-clockwise (Pillow's ROTATE_90).
    """
    swap, rev_y, rev_x = _AXES.get(orientation, _AXES[1])
    if swap:
        arr = arr.swapaxes(0, 1)
    if rev_y:
        arr = arr[::-1]
    if rev_x:
        arr = arr[:, ::-1]
    return arr


def choose_dct_denominator(crop_height: int, crop_width: int, image_size: int,
                           config: DecodeConfig = DecodeConfig()) -> int:
    """Pick the largest DCT reduction that keeps the crop at least the output size.

    Parameters
    ----------
    crop_height, crop_width : int
        The crop box in full-resolution pixels.
    image_size : int
        Output side S in pixels.
    config : DecodeConfig
        ``dct_scaling``, ``max_denominator`` and ``margin`` apply.

    Returns
    -------
    int
        d in (8, 4, 2, 1) with ``min(crop_height, crop_width) / d >= margin * S``
        and ``d <= max_denominator``; 1 when scaling is off or nothing fits.
    """
    if not config.dct_scaling:
        return 1
    need = config.margin * image_size
    for d in DCT_DENOMINATORS:
        if d <= config.max_denominator and min(crop_height, crop_width) / d >= need:
            return d
    return 1


def decode_jpeg_scaled(data: bytes, header: JpegHeader, denominator: int,
                       config: DecodeConfig = DecodeConfig()) -> np.ndarray:
    """Decode a JPEG to RGB at 1/denominator size with libjpeg-turbo (simplejpeg).

    Parameters
    ----------
    data : bytes
        The JPEG file.
    header : JpegHeader
        Its header (:func:`read_header`); the stored size sets the request.
    denominator : int
        1, 2, 4 or 8.
    config : DecodeConfig
        ``fastdct`` and ``fastupsample`` are passed to the decoder.

    Returns
    -------
    numpy.ndarray
        (ceil(H/d), ceil(W/d), 3) uint8 RGB in *stored* orientation (EXIF not applied).

    Raises
    ------
    ValueError
        From simplejpeg, for a corrupt or truncated file (``strict=True``:
        libjpeg warnings such as "premature end of data" are errors).
    """
    import simplejpeg

    d = int(denominator)
    if d > 1:
        return simplejpeg.decode_jpeg(data, colorspace="RGB", fastdct=config.fastdct,
                                      fastupsample=config.fastupsample, strict=True,
                                      min_height=-(-header.stored_height // d),
                                      min_width=-(-header.stored_width // d), min_factor=d)
    return simplejpeg.decode_jpeg(data, colorspace="RGB", fastdct=config.fastdct,
                                  fastupsample=config.fastupsample, strict=True)


def _edges(u0: float, u1: float, full: int, reduced: int, reversed_: bool, d: int) -> tuple[float, float]:
    """Map a crop interval on one upright axis into the reduced, upright image.

    libjpeg-turbo's reduced output pixel j covers stored pixels [j*d, (j+1)*d),
    so a stored coordinate x maps to x / d. An axis that the EXIF orientation
    reverses is measured from the other end of the stored axis, whose reduced
    extent is ``reduced`` (= ceil(full / d), which differs from full / d when d
    does not divide the size).
    """
    if not reversed_:
        return u0 / d, u1 / d
    return reduced - (full - u0) / d, reduced - (full - u1) / d


def _resize_box(region: np.ndarray, box: tuple[float, float, float, float] | None, size: int) -> np.ndarray:
    """Bilinear (antialiased) resize of ``region`` (restricted to ``box`` = left, top, right, bottom)."""
    from PIL import Image

    region = np.ascontiguousarray(region)
    h, w = region.shape[:2]
    im = Image.frombuffer("RGB", (w, h), region, "raw", "RGB", 0, 1)  # fromarray without its Python checks
    return np.asarray(im.resize((size, size), Image.Resampling.BILINEAR, box=box))


def _write(out: np.ndarray | None, image: np.ndarray, flip: bool) -> np.ndarray:
    view = image[:, ::-1] if flip else image
    if out is None:
        return np.ascontiguousarray(view)
    out[...] = view
    return out


def _check_out(out: np.ndarray | None, size: int) -> None:
    if out is not None and (out.shape != (size, size, 3) or out.dtype != np.uint8):
        raise ParameterError(
            f"out must be a ({size}, {size}, 3) uint8 array (one slot of the batch buffer), got "
            f"{out.shape} {out.dtype}"
        )


def plan_decode(path: str | os.PathLike, *, seed: int, epoch: int, index: int,
                transform: ImageTransformConfig, config: DecodeConfig = DecodeConfig(),
                data: bytes | None = None) -> DecodePlan:
    """Read a file and decide how to decode it: route, crop draw and DCT scale (no pixel decoded).

    The cheap, Python-level half of :func:`decode_augment`; :func:`run_plan`
    is the heavy half (decode, resize), which releases the GIL. A batch plans
    all its images first and decodes them on a thread pool.

    Parameters
    ----------
    path : str or os.PathLike
    seed, epoch, index : int
        Key of the item's random generator.
    transform : ImageTransformConfig
    config : DecodeConfig
    data : bytes, optional
        The file's bytes if already read.

    Returns
    -------
    DecodePlan
    """
    p = str(path)
    if data is None:
        try:
            with open(p, "rb") as fh:
                data = fh.read()
        except OSError:
            data = b""  # the reference route names the problem (missing file, ...)
    key = dict(seed=int(seed), epoch=int(epoch), index=int(index))
    header = read_header(data)
    if header is None:
        why = "not a JPEG" if not _is_jpeg(data) else "JPEG header not readable by libjpeg-turbo"
        return DecodePlan(p, data, None, None, 1, "reference", why, **key)
    if not header.turbo_ok:
        why = f"{header.colorspace} JPEG: libjpeg-turbo cannot convert it to RGB"
        return DecodePlan(p, data, None, None, 1, "reference", why, **key)
    params = sample_augment(item_generator(seed, epoch, index), header.height, header.width, transform)
    d = choose_dct_denominator(params.height, params.width, transform.image_size, config)
    return DecodePlan(p, data, header, params, d, "turbo", "", **key)


def _run_reference(plan: DecodePlan, transform: ImageTransformConfig, out, why: str) -> DecodeResult:
    rgb = load_rgb(plan.path)  # raises BadImage with a reason
    height, width = rgb.shape[:2]
    params = sample_augment(item_generator(plan.seed, plan.epoch, plan.index), height, width, transform)
    crop = rgb[params.top: params.top + params.height, params.left: params.left + params.width]
    image = _write(out, _resize_box(crop, None, transform.image_size), params.flip)
    return DecodeResult(image, "reference", why, 1, params, height, width)


def run_plan(plan: DecodePlan, transform: ImageTransformConfig, config: DecodeConfig = DecodeConfig(),
             out: np.ndarray | None = None) -> DecodeResult:
    """Decode, orient, crop, resize and flip one planned image (the GIL-releasing half).

    Parameters
    ----------
    plan : DecodePlan
        From :func:`plan_decode` with the same ``transform`` and ``config``.
    transform : ImageTransformConfig
    config : DecodeConfig
    out : numpy.ndarray, optional
        (S, S, 3) uint8 array to write into.

    Returns
    -------
    DecodeResult

    Raises
    ------
    helpers.pipeline.images.BadImage
        When neither route can decode the file.
    ParameterError
        If ``out`` has the wrong shape or dtype.
    """
    size = transform.image_size
    _check_out(out, size)
    if plan.route != "turbo":
        return _run_reference(plan, transform, out, plan.why)
    header, params, d = plan.header, plan.params, plan.denominator
    try:
        decoded = decode_jpeg_scaled(plan.data, header, d, config)
    except (ValueError, RuntimeError, OSError) as exc:  # simplejpeg raises ValueError on corrupt data
        return _run_reference(plan, transform, out, f"simplejpeg failed ({exc})")
    expected = (-(-header.stored_height // d), -(-header.stored_width // d))
    if decoded.shape[:2] != expected:  # the decoder chose another scale: redo at full size
        logger.debug("%s: simplejpeg returned %s for 1/%d (expected %s); decoding at full size",
                     plan.path, decoded.shape, d, expected)
        d = 1
        decoded = decode_jpeg_scaled(plan.data, header, 1, config)
    upright = apply_orientation(decoded, header.orientation)
    _, rev_y, rev_x = _AXES[header.orientation]
    if d == 1:  # integer box: crop then resize, exactly as the reference does
        region = upright[params.top: params.top + params.height, params.left: params.left + params.width]
        box = None
    else:
        y0, y1 = _edges(params.top, params.top + params.height, header.height, upright.shape[0], rev_y, d)
        x0, x1 = _edges(params.left, params.left + params.width, header.width, upright.shape[1], rev_x, d)
        r0, c0 = max(0, math.floor(y0)), max(0, math.floor(x0))
        r1, c1 = min(upright.shape[0], math.ceil(y1)), min(upright.shape[1], math.ceil(x1))
        region = upright[r0:r1, c0:c1]
        box = (max(0.0, x0 - c0), max(0.0, y0 - r0), min(float(c1 - c0), x1 - c0), min(float(r1 - r0), y1 - r0))
    image = _write(out, _resize_box(region, box, size), params.flip)
    return DecodeResult(image, "turbo", "", d, params, header.height, header.width)


def decode_augment(path: str | os.PathLike, *, seed: int, epoch: int, index: int,
                   transform: ImageTransformConfig, config: DecodeConfig = DecodeConfig(),
                   out: np.ndarray | None = None, data: bytes | None = None) -> DecodeResult:
    """Decode one image and apply the baseline's augmentation, fast, on uint8.

    :func:`plan_decode` then :func:`run_plan`. The crop and flip are the
    baseline's draws for ``(seed, epoch, index)`` (same generator, same
    upright size), so the result matches :func:`reference_augment` within the
    decode tolerance.

    Parameters
    ----------
    path : str or os.PathLike
        The image file (any format; non-JPEG files take the reference route).
    seed, epoch, index : int
        Key of the item's random generator (:func:`~helpers.pipeline.baseline.item_generator`).
    transform : ImageTransformConfig
        Output size ``image_size`` and crop and flip ranges.
    config : DecodeConfig
        DCT scaling and decoder flags.
    out : numpy.ndarray, optional
        (S, S, 3) uint8 array to write into (a slot of a batch buffer).
    data : bytes, optional
        The file's bytes if already read (the file is then not opened).

    Returns
    -------
    DecodeResult
        ``image`` is (S, S, 3) uint8 RGB (``out`` itself when given).

    Raises
    ------
    helpers.pipeline.images.BadImage
        When the file cannot be decoded by either route (missing, empty,
        truncated, corrupt, unsupported mode); ``reason`` says why.
    ParameterError
        If ``out`` has the wrong shape or dtype.
    """
    _check_out(out, transform.image_size)
    plan = plan_decode(path, seed=seed, epoch=epoch, index=index, transform=transform, config=config, data=data)
    return run_plan(plan, transform, config, out)


def reference_augment(path: str | os.PathLike, *, seed: int, epoch: int, index: int,
                      transform: ImageTransformConfig) -> np.ndarray:
    """The baseline's per-image result, kept as uint8 (the yardstick of every fast path).

    Pillow's reference decode (:func:`~helpers.pipeline.images.load_rgb`: EXIF
    applied, any mode to RGB), the baseline's crop for ``(seed, epoch,
    index)``, Pillow bilinear resize to S x S, then the flip: exactly
    :func:`helpers.pipeline.baseline.augment_one` before its float
    conversion and normalization.

    Parameters
    ----------
    path : str or os.PathLike
    seed, epoch, index : int
    transform : ImageTransformConfig

    Returns
    -------
    numpy.ndarray
        (S, S, 3) uint8 RGB.

    Raises
    ------
    helpers.pipeline.images.BadImage
        When Pillow cannot decode the file.
    """
    from PIL import Image

    rgb = load_rgb(path)
    params = sample_augment(item_generator(seed, epoch, index), rgb.shape[0], rgb.shape[1], transform)
    crop = rgb[params.top: params.top + params.height, params.left: params.left + params.width]
    size = transform.image_size
    resized = np.asarray(Image.fromarray(crop).resize((size, size), Image.Resampling.BILINEAR))
    return np.ascontiguousarray(resized[:, ::-1] if params.flip else resized)


def psnr(a: np.ndarray, b: np.ndarray, *, peak: float = 255.0) -> float:
    """Peak signal-to-noise ratio between two images, in dB.

    ``10 * log10(peak**2 / MSE)``; identical images give ``inf``.

    Parameters
    ----------
    a, b : numpy.ndarray
        Same shape; any numeric dtype (uint8 images: ``peak=255``).
    peak : float, default 255.0
        Largest possible pixel value.

    Returns
    -------
    float
        dB; about 30 dB is "visibly similar", above 40 dB differences are
        rarely visible (a rule of thumb for 8-bit images).

    Raises
    ------
    ParameterError
        If the shapes differ.
    """
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        raise ParameterError(f"psnr needs two arrays of the same shape, got {a.shape} and {b.shape}")
    mse = float(np.mean((a - b) ** 2))
    return math.inf if mse == 0 else 10.0 * math.log10(peak * peak / mse)


def fixtures_dir() -> Path | None:
    """The repository's folder of awkward image files (``data/fixtures``), or None when not shipped.

    Returns
    -------
    pathlib.Path or None
        ``<repository>/data/fixtures`` when this package runs from a source
        checkout (it is not part of an installed wheel).
    """
    folder = Path(__file__).resolve().parents[2] / "data" / "fixtures"
    return folder if folder.is_dir() else None


def compare_routes(paths, *, transform: ImageTransformConfig, config: DecodeConfig = DecodeConfig(),
                   seed: int = 0, epoch: int = 0):
    """Decode each file by the fast path and by the reference, and say whether they agree.

    For the awkward-file fixtures (truncated: pytorch/vision#138; CMYK,
    16-bit: pytorch/vision#6538; channel order): every file must either decode on
    both paths to the same picture (PSNR), or be rejected by both with the
    same reason.

    Parameters
    ----------
    paths : iterable of str or os.PathLike
    transform : ImageTransformConfig
    config : DecodeConfig
    seed, epoch : int
        Generator key (the file's position in ``paths`` is its index).

    Returns
    -------
    pandas.DataFrame
        One row per file: ``file`` (name), ``route`` (fast path's route, or
        "rejected"), ``why`` (reason for the reference route or rejection),
        ``reference`` ("decodes" or the reference's rejection reason),
        ``psnr_db`` (fast vs reference; NaN when rejected), ``agree`` (bool:
        both decode, or both reject with the same reason).
    """
    import pandas as pd

    rows = []
    for k, path in enumerate(paths):
        name = Path(path).name
        fast = ref = None
        fast_err = ref_err = ""
        try:
            fast = decode_augment(path, seed=seed, epoch=epoch, index=k, transform=transform, config=config)
        except BadImage as exc:
            fast_err = exc.reason
        try:
            ref = reference_augment(path, seed=seed, epoch=epoch, index=k, transform=transform)
        except BadImage as exc:
            ref_err = exc.reason
        if fast is not None and ref is not None:
            rows.append({"file": name, "route": fast.route, "why": fast.why, "reference": "decodes",
                         "psnr_db": psnr(fast.image, ref), "agree": True})
        else:
            rows.append({"file": name, "route": "rejected" if fast is None else fast.route, "why": fast_err,
                         "reference": "decodes" if ref is not None else ref_err, "psnr_db": math.nan,
                         "agree": fast is None and ref is None and fast_err == ref_err})
    return pd.DataFrame(rows, columns=["file", "route", "why", "reference", "psnr_db", "agree"])


def corner_colours(path: str | os.PathLike, *, config: DecodeConfig = DecodeConfig(), size: int = 32) -> dict:
    """Name the dominant colour of three corners of a picture, decoded by the fast path.

    The whole picture is squashed to ``size x size`` (crop = the full frame,
    no flip), so a fixture with pure red, green and blue corner squares
    (``data/fixtures/rgb_patches.*``) must come out red, green, blue: a BGR
    decoder (OpenCV's default) would swap red and blue.

    Parameters
    ----------
    path : str or os.PathLike
    config : DecodeConfig
    size : int, default 32

    Returns
    -------
    dict
        ``{"top-left": name, "top-right": name, "bottom-left": name}``, each
        one of "red", "green", "blue" or "mixed".
    """
    header = read_header(Path(path).read_bytes())
    aspect = (header.width / header.height) if header else 1.0
    if not header:
        rgb = load_rgb(path)
        aspect = rgb.shape[1] / rgb.shape[0]
    tr = ImageTransformConfig(image_size=size, crop_scale=(1.0, 1.0), crop_ratio=(aspect, aspect), flip_p=0.0)
    img = decode_augment(path, seed=0, epoch=0, index=0, transform=tr, config=config).image.astype(int)
    names = ("red", "green", "blue")

    def name_of(px) -> str:
        c = int(np.argmax(px))
        return names[c] if px[c] > 150 and all(px[o] < 100 for o in range(3) if o != c) else "mixed"

    # centres of the fixture's corner squares (1/6 of the width, 1/4 of the height)
    y, x = size // 8, size // 12
    return {"top-left": name_of(img[y, x]), "top-right": name_of(img[y, size - 1 - x]),
            "bottom-left": name_of(img[size - 1 - y, x])}


# --------------------------------------------------------------------------- GPU and NPU variants


def cuda_decode_support(acc) -> tuple[bool, str]:
    """Whether batched GPU decode (torchvision's nvjpeg path) can run here, and why not.

    Parameters
    ----------
    acc : helpers.device.Accelerator

    Returns
    -------
    (bool, str)
        True and a description, or False and the reason (not CUDA; torchvision
        not installed; torchvision without ``io.decode_jpeg``).
    """
    from importlib.util import find_spec

    if acc.kind != "cuda":
        return False, (f"the device is {acc.kind}, and batched GPU decode here means torchvision's "
                       "decode_jpeg(..., device='cuda') (nvjpeg), which needs a CUDA device")
    if find_spec("torchvision") is None:
        return False, "torchvision is not installed (pip install a torchvision build that matches this torch)"
    try:
        from torchvision.io import decode_jpeg  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - a broken torchvision must not break the notebook
        return False, f"torchvision.io.decode_jpeg is not importable ({type(exc).__name__}: {exc})"
    return True, "torchvision.io.decode_jpeg(list of tensors, device='cuda') decodes the batch with nvjpeg"


def _orient_chw(t, orientation: int):
    """:func:`apply_orientation` for a (C, H, W) torch tensor (a view)."""
    swap, rev_y, rev_x = _AXES.get(orientation, _AXES[1])
    if swap:
        t = t.transpose(1, 2)
    if rev_y:
        t = t.flip(1)
    if rev_x:
        t = t.flip(2)
    return t


def decode_augment_cuda(plans: list[DecodePlan], image_size: int, acc) -> "torch.Tensor":
    """Decode a batch of planned JPEGs on the GPU (nvjpeg via torchvision) and crop, resize, flip there.

    One ``torchvision.io.decode_jpeg(list, mode=ImageReadMode.RGB,
    device="cuda")`` call decodes the whole batch (torchvision documents
    that a list is more efficient than repeated calls on CUDA). torchvision
    ignores ``apply_exif_orientation`` on the CUDA path
    (``torchvision/io/image.py``), so the EXIF orientation read by
    :func:`plan_decode` is applied here. Then, per image: the planned crop,
    ``torch.nn.functional.interpolate`` (bilinear, ``antialias=True``) to
    S x S, the flip. No DCT-domain scaling (nvjpeg decodes at full size).

    Only turbo-route plans (colour or grey JPEGs) may be passed: CMYK and
    non-JPEG files stay on the CPU path. Not run on the machine this was
    written on (no CUDA device): compare its output with
    :func:`reference_augment` (PSNR) before trusting it, as notebook 02 does.

    Parameters
    ----------
    plans : list of DecodePlan
        From :func:`plan_decode`, all with ``route == "turbo"``.
    image_size : int
        Output side S.
    acc : helpers.device.Accelerator
        A CUDA device.

    Returns
    -------
    torch.Tensor
        (B, S, S, 3) uint8 on the GPU, RGB.

    Raises
    ------
    helpers.errors.DeviceUnavailableError
        When :func:`cuda_decode_support` says no.
    ParameterError
        If a plan is not on the turbo route.
    """
    import torch
    import torch.nn.functional as F

    ok, why = cuda_decode_support(acc)
    if not ok:
        raise DeviceUnavailableError(f"batched GPU decode is not available: {why}")
    not_jpeg = [p.path for p in plans if p.route != "turbo"]
    if not_jpeg:
        raise ParameterError(f"GPU decode takes colour or grey JPEGs only; these take the CPU path: {not_jpeg[:3]}")
    from torchvision.io import ImageReadMode, decode_jpeg

    raw = [torch.frombuffer(bytearray(p.data), dtype=torch.uint8) for p in plans]
    decoded = decode_jpeg(raw, mode=ImageReadMode.RGB, device=acc.device)
    out = torch.empty((len(raw), image_size, image_size, 3), dtype=torch.uint8, device=acc.device)
    for k, (img, plan) in enumerate(zip(decoded, plans)):
        prm = plan.params
        upright = _orient_chw(img, plan.header.orientation)
        crop = upright[:, prm.top: prm.top + prm.height, prm.left: prm.left + prm.width].unsqueeze(0).float()
        small = F.interpolate(crop, size=(image_size, image_size), mode="bilinear", align_corners=False,
                              antialias=True)
        small = small.round_().clamp_(0, 255).to(torch.uint8)[0]
        if prm.flip:
            small = small.flip(-1)
        out[k] = small.permute(1, 2, 0)
    return out


def npu_decode_note() -> str:
    """What exists for image decode on an Ascend NPU, stated as checked (not run here).

    Returns
    -------
    str
        One paragraph for notebook 02.
    """
    return (
        "Ascend's Torchvision Adapter (the torchvision_npu package, https://gitee.com/ascend/vision, "
        "branches paired with torchvision 0.16 to 0.21) documents an NPU image-processing backend built on "
        "the chip's DVPP unit, and its ImageFolder loader decodes JPEGs on the NPU. Its pairing with this "
        "torch version was not found, and it could not be run where this workbook was written (no Ascend "
        "hardware), so this workbook does not call it: not verified. On an NPU the batched CPU pipeline "
        "above is what this notebook measures; the uint8 batch is copied once and normalized on the NPU."
    )
