"""Decode once: the dataset's images kept decoded, at the size their crops need, in one memory-mapped file.

Most training reads the same images every epoch, so the fastest decode is the one not done again. This module
decodes every usable image of a dataset index once (the reference decode,
:func:`helpers.pipeline.images.load_rgb`: EXIF applied, any mode to RGB), shrinks it to the smallest size at
which the smallest crop the augmentation can draw still has ``margin x image_size`` pixels on its shorter side,
and stores the pixels as raw uint8 RGB in one file that every batch reads through ``numpy.memmap`` (the page
cache serves it; DataLoader workers share those pages). A batch then crops and resizes in memory: no file
opened, no JPEG decoded.

Why raw arrays in a memory-mapped file, and not re-encoded JPEGs or a sharded format: at these sizes a
re-encoded JPEG must still be decoded every epoch (the cost this cache exists to remove), and the sharded
formats of webdataset, litdata or mosaicml-streaming are built for sequential streaming from object storage,
while a training loop with a random sampler reads items in any order; a memory-mapped array gives that random
access at memory speed with nothing but NumPy. The price is size, so the cache is bounded (``max_bytes``) and
checked before anything is decoded.

Crops are drawn exactly as the baseline draws them (:func:`helpers.pipeline.baseline.sample_augment` on the
*original* upright size with the item's generator), then mapped to the cached image with sub-pixel precision;
the pixels are not identical to the per-image pipeline's (the image was shrunk once before the crop's own
resize), which :func:`helpers.pipeline.decode.psnr` against the reference measures.

Never stale: the cache is keyed by the data folder, the size and the augmentation's crop range, and its
manifest holds a fingerprint of every source file (relative path, size, mtime in ns). Opening it recomputes
the fingerprint (one ``stat`` per file); a mismatch rebuilds it, or with ``on_stale="refuse"`` raises.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from helpers.errors import DataError, ParameterError
from helpers.fsutil import write_atomic
from helpers.pipeline.baseline import ImageTransformConfig, item_generator, sample_augment
from helpers.pipeline.decode import DecodeConfig, _resize_box, _write
from helpers.pipeline.fast import BatchedDataset, _Filled
from helpers.pipeline.images import BadImage, load_rgb
from helpers.pipeline.scan_cache import cache_root, locked

logger = logging.getLogger(__name__)

__all__ = ["CACHE_VERSION", "DEFAULT_MAX_BYTES", "CacheInfo", "ImageCache", "CachedDataset", "cache_dir",
           "cached_size", "fingerprint", "open_image_cache"]

#: Bumped when the file layout or the shrink rule changes: an older cache is rebuilt.
CACHE_VERSION = 1

#: Default bound on a cache's pixel file, bytes (2 GiB).
DEFAULT_MAX_BYTES = 2 << 30


def cache_dir() -> Path:
    """Folder of the decoded-image caches: ``decoded`` in the workbook's cache folder
    (:func:`helpers.pipeline.scan_cache.cache_root`: ``$WORKBOOK_CACHE_DIR`` or the user cache)."""
    return cache_root() / "decoded"


def cached_size(height: int, width: int, transform: ImageTransformConfig, margin: float = 1.0) -> tuple[int, int]:
    """The size an image is kept at: its smallest possible crop still ``margin x image_size`` px on each side.

    The smallest crop :func:`~helpers.pipeline.baseline.sample_augment` can draw has area
    ``crop_scale[0] x H x W`` and aspect ratio up to ``max(crop_ratio[1], 1 / crop_ratio[0])``, so its shorter
    side is ``sqrt(crop_scale[0] x H x W / that ratio)``. The image is shrunk by the factor that brings that side
    to ``margin x image_size`` (never enlarged).

    Returns
    -------
    (int, int)
        Cached height and width, px (>= 1).
    """
    ratio = max(transform.crop_ratio[1], 1.0 / transform.crop_ratio[0])
    smallest = math.sqrt(transform.crop_scale[0] * height * width / ratio)
    f = min(1.0, margin * transform.image_size / smallest) if smallest > 0 else 1.0
    return max(1, int(math.ceil(height * f))), max(1, int(math.ceil(width * f)))


def fingerprint(root: str | os.PathLike, paths) -> str:
    """SHA-256 of every source file's relative path, size and mtime (ns): what makes a cache stale.

    A file that cannot be stat-ed counts as ``-1, -1`` (so its reappearance changes the fingerprint too).
    """
    h = hashlib.sha256()
    base = str(Path(root))
    for p in paths:
        p = str(p)
        try:
            st = os.stat(p)
            size, mtime = st.st_size, st.st_mtime_ns
        except OSError:
            size = mtime = -1
        h.update(f"{os.path.relpath(p, base)}\0{size}\0{mtime}\n".encode())
    return h.hexdigest()


@dataclass(frozen=True)
class CacheInfo:
    """What a cache holds and what it cost.

    Attributes
    ----------
    path : pathlib.Path
        Its folder.
    images : int
        Items in it (the index's usable images).
    bytes : int
        Size of the pixel file.
    build_s : float or None
        Seconds this call spent building it (None: opened as it was).
    rebuilt_because : str
        Why it was (re)built: "new", "stale: ..." or "" when opened as it was.
    failed : dict
        Item -> reason, for files that could not be decoded at build time (their batches substitute them).
    """

    path: Path
    images: int
    bytes: int
    build_s: float | None
    rebuilt_because: str
    failed: dict


class ImageCache:
    """An opened cache: per item its original upright size, its cached size and its pixels (a memmap view).

    Made by :func:`open_image_cache`; picklable (a DataLoader worker reopens the file, it is not copied).
    """

    def __init__(self, path: Path, meta: dict[str, Any]) -> None:
        self.path = Path(path)
        self.meta = meta
        table = np.load(self.path / "items.npy")
        self.offsets, self.heights, self.widths = table[:, 0], table[:, 1], table[:, 2]
        self.orig_heights, self.orig_widths, self.ok = table[:, 3], table[:, 4], table[:, 5].astype(bool)
        self._pixels: np.memmap | None = None

    def __getstate__(self) -> dict:
        return {"path": self.path, "meta": self.meta}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["path"], state["meta"])

    def __len__(self) -> int:
        return int(self.offsets.shape[0])

    @property
    def pixels(self) -> np.memmap:
        """The pixel file, mapped read-only on first use."""
        if self._pixels is None:
            nbytes = max(1, int(self.meta["bytes"]))
            self._pixels = np.memmap(self.path / "pixels.u8", dtype=np.uint8, mode="r", shape=(nbytes,))
        return self._pixels

    def image(self, i: int) -> np.ndarray:
        """Item ``i``'s cached pixels, (h, w, 3) uint8, a view of the memmap (no copy)."""
        o, h, w = int(self.offsets[i]), int(self.heights[i]), int(self.widths[i])
        return self.pixels[o:o + h * w * 3].reshape(h, w, 3)


def _key(root: Path, transform: ImageTransformConfig, margin: float) -> str:
    text = json.dumps({"root": str(root), "image_size": transform.image_size, "crop_scale": transform.crop_scale,
                       "crop_ratio": transform.crop_ratio, "margin": margin, "version": CACHE_VERSION},
                      sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def _shrink(rgb: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    from PIL import Image

    h, w = size
    if (h, w) == rgb.shape[:2]:
        return np.ascontiguousarray(rgb)
    im = Image.fromarray(np.ascontiguousarray(rgb))
    return np.asarray(im.resize((w, h), Image.Resampling.BILINEAR))  # antialiased, as the baseline's resize


def _build(folder: Path, paths, transform: ImageTransformConfig, margin: float, max_bytes: int, threads: int,
           print_fn=None) -> dict:
    """Decode every image once, shrink it, write the pixel file, the item table and the manifest."""
    from PIL import Image

    n = len(paths)
    sizes = np.zeros((n, 2), dtype=np.int64)
    orig = np.zeros((n, 2), dtype=np.int64)
    failed: dict[int, str] = {}
    for i, p in enumerate(paths):  # headers only: the size bound is checked before any pixel is decoded
        try:
            with Image.open(p) as im:
                w, h = im.size
                orientation = im.getexif().get(0x0112, 1)
        except Exception as exc:  # noqa: BLE001 - the file is reported, its item substituted at read time
            failed[i] = f"unreadable: {type(exc).__name__}: {exc}"
            continue
        if orientation in (5, 6, 7, 8):
            h, w = w, h
        orig[i] = (h, w)
        sizes[i] = cached_size(h, w, transform, margin)
    total = int((sizes[:, 0] * sizes[:, 1] * 3).sum())
    if total > max_bytes:
        raise DataError(f"the decoded-image cache of {n} images at image_size {transform.image_size} would take "
                        f"{total / 2**20:.0f} MiB, above its bound of {max_bytes / 2**20:.0f} MiB: raise the bound "
                        "(max_cache_mib), or cache fewer images (max_images)")
    offsets = np.zeros(n, dtype=np.int64)
    offsets[1:] = np.cumsum(sizes[:, 0] * sizes[:, 1] * 3)[:-1]
    tmp = folder / "pixels.u8.tmp"
    pixels = np.memmap(tmp, dtype=np.uint8, mode="w+", shape=(max(1, total),))

    def one(i: int) -> None:
        if i in failed:
            return
        try:
            rgb = load_rgb(paths[i])
        except BadImage as exc:
            failed[i] = exc.reason
            return
        if rgb.shape[:2] == tuple(orig[i][::-1]):  # the header's orientation disagreed: trust the decode
            orig[i], sizes[i] = orig[i][::-1].copy(), sizes[i][::-1].copy()  # same bytes, so the same offsets
        small = _shrink(rgb, tuple(int(v) for v in sizes[i]))
        if small.shape[:2] != tuple(sizes[i]):
            failed[i] = f"decoded to {rgb.shape[:2]}, not the header's size"
            return
        o = int(offsets[i])
        pixels[o:o + small.size] = small.reshape(-1)

    with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:  # Pillow releases the GIL while decoding
        list(pool.map(one, range(n)))
    pixels.flush()  # the mapping itself goes with this function's frame
    os.replace(tmp, folder / "pixels.u8")
    ok = np.array([i not in failed for i in range(n)], dtype=np.int64)
    table = np.stack([offsets, sizes[:, 0], sizes[:, 1], orig[:, 0], orig[:, 1], ok], axis=1)
    np.save(folder / "items.npy", table)
    return {"bytes": total, "failed": {str(k): v for k, v in failed.items()}}


def open_image_cache(index, transform: ImageTransformConfig, *, margin: float | None = None,
                     max_bytes: int = DEFAULT_MAX_BYTES, on_stale: str = "rebuild", threads: int = 0,
                     root: str | os.PathLike | None = None) -> tuple[ImageCache, CacheInfo]:
    """Open the decoded-image cache of ``index`` at ``transform``'s size, building or rebuilding it when needed.

    Parameters
    ----------
    index : helpers.pipeline.dataset.DatasetIndex
        The usable images (``paths``, ``root``).
    transform : ImageTransformConfig
        Output size and crop range (they decide the cached size).
    margin : float, optional
        Shorter side of the smallest crop, in output sizes (default: :class:`DecodeConfig`'s, as the DCT-scaled
        decode uses).
    max_bytes : int
        Bound on the pixel file, bytes: a cache that would be larger is refused before any decode.
    on_stale : {"rebuild", "refuse"}
        What to do when a source file changed since the build.
    threads : int
        Decode threads for a build (0: usable cores).
    root : path, optional
        Folder of the caches (default :func:`cache_dir`).

    Returns
    -------
    (ImageCache, CacheInfo)

    Raises
    ------
    ParameterError
        Bad ``on_stale``, ``max_bytes`` or ``margin``.
    DataError
        The cache would exceed ``max_bytes``; or it is stale and ``on_stale="refuse"``.
    """
    if on_stale not in ("rebuild", "refuse"):
        raise ParameterError(f"on_stale must be 'rebuild' or 'refuse', got {on_stale!r}")
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1:
        raise ParameterError(f"max_bytes must be a positive int (bytes), got {max_bytes!r}")
    margin = float(DecodeConfig().margin if margin is None else margin)
    if not margin > 0:
        raise ParameterError(f"margin must be > 0, got {margin!r}")
    from helpers.device import usable_cores

    paths = [str(p) for p in index.paths]
    data_root = Path(getattr(index, "root", None) or os.path.commonpath(paths) or ".").resolve()
    folder = Path(root or cache_dir()) / _key(data_root, transform, margin)
    folder.mkdir(parents=True, exist_ok=True)
    with locked(folder / ".lock"):  # one process builds; the others wait and open what it built
        want = fingerprint(data_root, paths)
        manifest_path = folder / "manifest.json"
        meta = json.loads(manifest_path.read_text()) if manifest_path.is_file() else None
        why = ""
        if meta is None:
            why = "new"
        elif meta.get("version") != CACHE_VERSION or meta.get("fingerprint") != want or meta.get("n") != len(paths):
            why = "stale: the source folder changed since the cache was built"
            if on_stale == "refuse":
                raise DataError(f"the decoded-image cache {folder} is stale ({why[7:]}); rebuild it "
                                "(on_stale='rebuild') or restore the files")
        build_s = None
        if why:
            manifest_path.unlink(missing_ok=True)  # a build that dies half way leaves no valid manifest
            t0 = time.perf_counter()
            built = _build(folder, paths, transform, margin, max_bytes, threads or usable_cores())
            build_s = time.perf_counter() - t0
            meta = {"version": CACHE_VERSION, "fingerprint": want, "n": len(paths), "bytes": built["bytes"],
                    "failed": built["failed"], "root": str(data_root), "image_size": transform.image_size,
                    "margin": margin, "build_s": build_s}
            write_atomic(manifest_path, json.dumps(meta, indent=1))
            logger.info("decoded-image cache %s: %s, %d images, %.1f MiB in %.1f s", folder, why, len(paths),
                        built["bytes"] / 2**20, build_s)
        elif meta["bytes"] > max_bytes:
            raise DataError(f"the decoded-image cache {folder} takes {meta['bytes'] / 2**20:.0f} MiB, above the "
                            f"bound of {max_bytes / 2**20:.0f} MiB: raise the bound (max_cache_mib)")
    cache = ImageCache(folder, meta)
    failed = {int(k): v for k, v in meta.get("failed", {}).items()}
    return cache, CacheInfo(folder, len(paths), int(meta["bytes"]), build_s, why, failed)


class CachedDataset(BatchedDataset):
    """The batched pipeline reading from the decoded-image cache: crop and resize in memory, no decode.

    Same batches as :class:`helpers.pipeline.fast.BatchedDataset` (uint8 NHWC images in a reused buffer,
    tokens, labels, timing and skipped-file fields; the same crop and flip per ``(seed, epoch, index)``),
    the same thread pool and the same substitution of bad items; the images come from ``cache``.

    Parameters
    ----------
    index, tokenizer :
        As :class:`~helpers.pipeline.fast.BatchedDataset`.
    cache : ImageCache
        :func:`open_image_cache` of the same index and transform.
    **kwargs :
        Passed to :class:`~helpers.pipeline.fast.BatchedDataset`.

    Raises
    ------
    ParameterError
        A cache of another size than the index.
    """

    def __init__(self, index, tokenizer, *, cache: ImageCache, **kwargs: Any) -> None:
        super().__init__(index, tokenizer, **kwargs)
        if len(cache) != len(self):
            raise ParameterError(f"the cache holds {len(cache)} images, the index {len(self)}: open the cache "
                                 "of this index")
        self.cache = cache

    def _plan(self, i: int):
        """Item i's place in the cache (None for an item known bad or that failed at build time)."""
        if i in self._bad:
            return None
        if not self.cache.ok[i]:
            reason = self.cache.meta.get("failed", {}).get(str(i), "could not be decoded when the cache was built")
            self._note_bad(i, reason)
            return None
        return i

    def _run(self, plan, i: int, out: np.ndarray) -> _Filled | str:
        if plan is None:
            return self._bad.get(i, "not in the cache")
        c = self.cache
        h0, w0 = int(c.orig_heights[i]), int(c.orig_widths[i])
        params = sample_augment(item_generator(self.seed, self.epoch, i), h0, w0, self.transform)
        image = c.image(i)
        fy, fx = image.shape[0] / h0, image.shape[1] / w0
        box = (params.left * fx, params.top * fy, (params.left + params.width) * fx,
               (params.top + params.height) * fy)
        _write(out, _resize_box(image, box, self.transform.image_size), params.flip)
        return _Filled(i, "cache", "", 1, ())
