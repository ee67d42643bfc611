"""The reference image decode and the up-front scan for bad files.

Every decoder path in the workbook (per-image Pillow, batched simplejpeg,
DCT-domain scaling, ...) is checked against :func:`load_rgb`, the one
reference decode. It returns an ``(H, W, 3)`` ``uint8`` array in **RGB**
order, upright (EXIF orientation applied), whatever the file's mode.

:func:`scan_images` fully decodes a list of files up front and reports the
bad ones with a short human reason, so that a truncated or unreadable file is
found before training instead of crashing a DataLoader worker late in an
epoch (pytorch/vision#138). This module never sets
``PIL.ImageFile.LOAD_TRUNCATED_IMAGES``, and refuses to decode (DataError)
when other code has set it: a truncated file must fail, not decode silently
into a partly grey picture.

Mode handling of :func:`load_rgb` (pytorch/vision#6538):

=====================  ==================================================
file mode (Pillow)     what the reference decode does
=====================  ==================================================
RGB                    as is
L, 1                   grey replicated into R, G and B
I;16, I;16L/B/N, I     16-bit grey scaled to 8 bits by ``value >> 8``
                       (Pillow's own ``convert('RGB')`` *clips* these
                       values at 255, which turns most pixels white)
CMYK                   Pillow's conversion; Pillow reads the inverted CMYK
                       that Adobe software writes (APP14 marker) correctly.
                       Embedded ICC profiles are not applied.
YCbCr, HSV, RGBX       Pillow's conversion to RGB
RGBA, LA, PA, RGBa,    composited over an opaque **white** background
La, P with             (the usual choice of browsers and image viewers for
transparency           a page background; black would darken soft edges)
P without transparency palette expanded to RGB
anything else          rejected (:class:`BadImage`, "unsupported mode ...")
                       e.g. F (float), LAB, I with values outside 0..65535
=====================  ==================================================
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from helpers.errors import DataError, ParameterError

logger = logging.getLogger(__name__)

#: File name endings treated as images when a folder is listed (lower case).
IMAGE_SUFFIXES: tuple[str, ...] = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp")

_RGB_PASS_MODES = frozenset({"RGB"})
_GREY_MODES = frozenset({"L", "1"})
_SIXTEEN_BIT_MODES = frozenset({"I;16", "I;16L", "I;16B", "I;16N", "I"})
_CONVERT_MODES = frozenset({"CMYK", "YCbCr", "HSV", "RGBX"})
_ALPHA_MODES = frozenset({"RGBA", "LA", "PA", "RGBa", "La"})

# First bytes of the common image formats, to name the format in a reason
# when Pillow could not even open the file.
_MAGIC: tuple[tuple[bytes, str], ...] = (
    (b"\xff\xd8\xff", "JPEG"),
    (b"\x89PNG\r\n\x1a\n", "PNG"),
    (b"GIF87a", "GIF"),
    (b"GIF89a", "GIF"),
    (b"BM", "BMP"),
    (b"II*\x00", "TIFF"),
    (b"MM\x00*", "TIFF"),
)


class BadImage(DataError):
    """A file that cannot be decoded correctly into an RGB picture.

    Parameters
    ----------
    path : pathlib.Path or str
        The file.
    reason : str
        A short human reason, e.g. ``"truncated JPEG (image file is truncated)"``.

    Attributes
    ----------
    path : pathlib.Path
    reason : str
    """

    def __init__(self, path: Path | str, reason: str) -> None:
        self.path = Path(path)
        self.reason = reason
        super().__init__(
            f"cannot decode image {self.path}: {reason}. Replace or remove this file, "
            "or load the folder with load_dataset(), which scans it and skips bad files."
        )

    def __reduce__(self):  # keep the exception picklable across DataLoader workers
        return (type(self), (self.path, self.reason))


@dataclass(frozen=True)
class BadFile:
    """One file rejected by :func:`scan_images`.

    Attributes
    ----------
    path : pathlib.Path
        The file.
    reason : str
        A short human reason (see :class:`BadImage`).
    """

    path: Path
    reason: str


@dataclass(frozen=True)
class ScanReport:
    """What :func:`scan_images` found.

    Attributes
    ----------
    good : tuple of pathlib.Path
        Files that decode, in the order they were given.
    bad : tuple of BadFile
        Files that do not, in the order they were given, each with a reason.
    """

    good: tuple[Path, ...]
    bad: tuple[BadFile, ...]

    @property
    def n_checked(self) -> int:
        """Number of files scanned (good plus bad)."""
        return len(self.good) + len(self.bad)

    def frame(self):
        """Return the bad files as a table.

        Returns
        -------
        pandas.DataFrame
            One row per bad file, columns ``path`` (str) and ``reason`` (str);
            empty (with those columns) when every file decoded.
        """
        import pandas as pd

        return pd.DataFrame(
            {"path": [str(b.path) for b in self.bad], "reason": [b.reason for b in self.bad]},
            columns=["path", "reason"],
        )


def _sniff_format(path: Path) -> str:
    """Name a file's format from its first bytes, else from its suffix."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(16)
    except OSError:
        head = b""
    for magic, name in _MAGIC:
        if head.startswith(magic):
            return name
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "WEBP"
    suffix = path.suffix.lower().lstrip(".")
    return {"jpg": "JPEG", "jpeg": "JPEG", "tif": "TIFF"}.get(suffix, suffix.upper() or "file")


def _reason_for(exc: BaseException, path: Path, fmt: str | None) -> str:
    """Turn a decoder exception into a short human reason."""
    from PIL import Image, UnidentifiedImageError

    if isinstance(exc, UnidentifiedImageError):
        return "not an image (cannot identify image file)"
    if isinstance(exc, Image.DecompressionBombError):
        return f"too large (Pillow decompression-bomb limit: {exc})"
    fmt = fmt or _sniff_format(path)
    msg = str(exc).strip() or type(exc).__name__
    if "truncated" in msg.lower():
        return f"truncated {fmt} (image file is truncated)"
    return f"corrupt {fmt} ({type(exc).__name__}: {msg})"


def _composite_on_white(im) -> np.ndarray:
    """Composite an image with alpha over opaque white; return (H, W, 3) uint8."""
    from PIL import Image

    rgba = im.convert("RGBA")
    background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
    return np.array(Image.alpha_composite(background, rgba).convert("RGB"))


def _grey_to_rgb(grey: np.ndarray) -> np.ndarray:
    """Replicate an (H, W) uint8 array into (H, W, 3)."""
    return np.ascontiguousarray(np.repeat(grey[:, :, None], 3, axis=2))


def to_rgb_array(im, path: Path | str = "<image>") -> np.ndarray:
    """Convert an opened, loaded Pillow image to the reference RGB array.

    This is the mode conversion of :func:`load_rgb` without the file reading
    and without the EXIF orientation; see the module docstring for the rule
    applied to each mode.

    Parameters
    ----------
    im : PIL.Image.Image
        A loaded image of any mode.
    path : pathlib.Path or str, optional
        Only used in the error message.

    Returns
    -------
    numpy.ndarray
        Shape (H, W, 3), dtype uint8, RGB order, C-contiguous and writable.

    Raises
    ------
    BadImage
        For a mode with no correct conversion (e.g. ``F``, ``LAB``), or a mode
        ``I`` image with values outside 0..65535.
    """
    mode = im.mode
    if mode in _RGB_PASS_MODES:
        arr = np.asarray(im)
        return arr if arr.flags.writeable else arr.copy()
    if mode in _GREY_MODES:
        return _grey_to_rgb(np.asarray(im.convert("L") if mode == "1" else im))
    if mode in _SIXTEEN_BIT_MODES:
        wide = np.asarray(im)
        if mode == "I" and wide.size and (int(wide.min()) < 0 or int(wide.max()) > 65535):
            raise BadImage(
                path,
                f"unsupported mode I (32-bit values from {int(wide.min())} to {int(wide.max())}, "
                "outside the 16-bit range 0..65535)",
            )
        return _grey_to_rgb((wide.astype(np.uint32) >> 8).astype(np.uint8))
    if mode in _CONVERT_MODES:
        return np.array(im.convert("RGB"))
    if mode in _ALPHA_MODES or (mode == "P" and "transparency" in im.info):
        return _composite_on_white(im)
    if mode == "P":
        return np.array(im.convert("RGB"))
    raise BadImage(path, f"unsupported mode {mode} (no correct conversion to 8-bit RGB)")


def _refuse_truncated_loading() -> None:
    """Raise if some code has switched Pillow to decode truncated files silently."""
    from PIL import ImageFile

    if ImageFile.LOAD_TRUNCATED_IMAGES:
        raise DataError(
            "PIL.ImageFile.LOAD_TRUNCATED_IMAGES is True (set by this program or a library it imported): "
            "Pillow would then decode truncated files silently into partly grey pictures. "
            "Set PIL.ImageFile.LOAD_TRUNCATED_IMAGES = False and scan the data instead (scan_images)"
        )


def load_rgb(path: str | os.PathLike) -> np.ndarray:
    """Decode one image file the reference way (Pillow).

    Reads the whole file (a truncated file raises), applies the EXIF
    orientation (``PIL.ImageOps.exif_transpose``) and converts the mode to
    8-bit RGB as the module docstring describes.

    Parameters
    ----------
    path : str or os.PathLike
        The image file.

    Returns
    -------
    numpy.ndarray
        Shape (H, W, 3), dtype uint8, channel order R, G, B; H and W are the
        upright size (after EXIF orientation).

    Raises
    ------
    BadImage
        (a :class:`helpers.errors.DataError`) when the file is missing, empty,
        not an image, truncated or corrupt, or of an unsupported mode; its
        ``reason`` attribute holds a short human reason.
    DataError
        If ``PIL.ImageFile.LOAD_TRUNCATED_IMAGES`` has been set to True.
    """
    from PIL import Image, ImageOps

    _refuse_truncated_loading()
    p = Path(path)
    try:
        size = p.stat().st_size
    except FileNotFoundError:
        raise BadImage(p, "missing file") from None
    if size == 0:
        raise BadImage(p, "zero-byte file")
    fmt: str | None = None
    try:
        with Image.open(p) as im:
            fmt = im.format
            im.load()
            upright = ImageOps.exif_transpose(im)
            return to_rgb_array(upright, p)
    except BadImage:
        raise
    except Exception as exc:  # decoders raise many types on corrupt data
        raise BadImage(p, _reason_for(exc, p, fmt)) from exc


def check_image_file(path: str | os.PathLike) -> BadFile | None:
    """Fully check one file: ``PIL.Image.verify()`` and then a full reference decode (:func:`load_rgb`).

    Parameters
    ----------
    path : str or os.PathLike

    Returns
    -------
    BadFile or None
        None when the file is a usable image, else the file and a short reason
        (missing, zero-byte, not an image, truncated, corrupt, unsupported mode).
    """
    from PIL import Image

    path = Path(path)
    try:
        if path.is_file() and path.stat().st_size > 0:
            fmt = None
            try:
                with Image.open(path) as im:
                    fmt = im.format
                    im.verify()  # structural checks (e.g. PNG chunk CRCs); needs a reopen after
            except Exception as exc:
                return BadFile(path, _reason_for(exc, path, fmt))
        load_rgb(path)
    except BadImage as exc:
        return BadFile(path, exc.reason)
    return None


def scan_images(paths: Iterable[str | os.PathLike], *, max_workers: int | None = None) -> ScanReport:
    """Fully decode every file and sort them into good and bad.

    Each file is checked with ``PIL.Image.verify()`` and then decoded with
    :func:`load_rgb`, so that truncation (which ``verify`` alone misses for
    JPEG) is caught. One warning line is logged per bad file.

    Parameters
    ----------
    paths : iterable of str or os.PathLike
        The files to check.
    max_workers : int, optional
        Threads used (Pillow releases the GIL while decoding). Default:
        ``min(8, os.cpu_count())``. 1 checks the files one by one.

    Returns
    -------
    ScanReport
        ``good`` and ``bad`` in the order the files were given.

    Raises
    ------
    ParameterError
        If ``max_workers`` is not a positive integer.
    DataError
        If ``PIL.ImageFile.LOAD_TRUNCATED_IMAGES`` has been set to True.
    """
    _refuse_truncated_loading()
    if max_workers is None:
        max_workers = min(8, os.cpu_count() or 1)
    if isinstance(max_workers, bool) or not isinstance(max_workers, int) or max_workers < 1:
        raise ParameterError(f"max_workers must be a positive integer, got {max_workers!r}; pass e.g. 4 or None")
    files = [Path(p) for p in paths]
    if max_workers == 1 or len(files) < 2:
        results = [check_image_file(p) for p in files]
    else:
        with ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="scan_images") as pool:
            results = list(pool.map(check_image_file, files))
    good: list[Path] = []
    bad: list[BadFile] = []
    for path, result in zip(files, results):
        if result is None:
            good.append(path)
        else:
            bad.append(result)
            logger.warning("bad image: %s: %s", path, result.reason)
    return ScanReport(good=tuple(good), bad=tuple(bad))
