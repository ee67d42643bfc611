"""The workbook's datasets: the embedded photo set and any user folder of images.

The embedded dataset is built on first use, deterministically, from the real
photographs that scikit-image ships inside its wheel (nothing is downloaded).
Only sources whose ``skimage.data`` docstring states public domain or CC0 are
used (see :data:`EMBEDDED_SOURCES`). Each output image is a random crop,
scale and flip of one source photo, written as a JPEG of mixed size, quality
and encoding (baseline or progressive), with a short caption and a label (the
index of its source photo, the reward target of the training workload).

Grey sources (brick, camera, clock, grass, gravel) are written as 3-channel
RGB JPEGs (grey replicated), so every decoded image has 3 channels and the
batch is uniform; the grey-JPEG case is covered by the fixtures instead
(``data/fixtures``).

A user folder is any folder of images (searched recursively), with optional
captions and labels; bad files are reported and skipped, never decoded wrong.
Per-sample metadata is held in NumPy arrays, not Python lists or dicts, so
that forked DataLoader workers do not copy it page by page as reference counts
change (pytorch/pytorch#13246).
"""

from __future__ import annotations

import csv
import io
import json
import logging
import os
import posixpath
import re
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import numpy as np

from helpers.errors import DataError, OutputDirError, ParameterError
from helpers.fsutil import in_checkout, repo_root
from helpers.pipeline.images import IMAGE_SUFFIXES, BadFile
from helpers.pipeline.scan_cache import prune_cache, scan_relative

logger = logging.getLogger(__name__)

#: Version of the embedded-dataset builder; a change forces a rebuild.
BUILDER_VERSION = 2

#: Environment variable that overrides :func:`default_data_root`.
DATA_DIR_ENV = "WORKBOOK_DATA_DIR"

_LONG_SIDE = (256, 1024)  # px, output long side, inclusive
_QUALITY = (60, 95)  # JPEG quality, inclusive
_AREA = (0.35, 1.0)  # fraction of the source kept by the crop
_ASPECT = (3 / 4, 4 / 3)  # crop width / height, drawn log-uniformly
_PROGRESSIVE_P = 0.25
_FLIP_P = 0.5
_MANIFEST_COLUMNS = ("file", "caption", "label", "source", "width", "height", "quality", "progressive")


@dataclass(frozen=True)
class EmbeddedSource:
    """One scikit-image photograph used by the embedded dataset.

    Attributes
    ----------
    name : str
        Function name in ``skimage.data``.
    license : str
        The licence as stated in that function's docstring.
    nouns : tuple of str
        Ways to name what the photo shows, used in captions.
    grey : bool
        Whether the source is a grey-level photo.
    """

    name: str
    license: str
    nouns: tuple[str, ...]
    grey: bool = False


#: The sources, in label order. Licences are quoted from the docstrings of
#: ``skimage.data`` (scikit-image 0.26). Left out: coins and
#: immunohistochemistry ("no known copyright restrictions", not a public-domain
#: or CC0 statement), moon, page and stereo_motorcycle (no licence stated),
#: text and cell (not photographs), microaneurysms (102 px).
EMBEDDED_SOURCES: tuple[EmbeddedSource, ...] = (
    EmbeddedSource("astronaut", "public domain (NASA)",
                   ("an astronaut in an orange spacesuit", "a smiling astronaut", "an astronaut beside a shuttle model")),
    EmbeddedSource("brick", "CC0 (CC0Textures)", ("a brick wall", "rows of bricks", "a wall of bricks"), grey=True),
    EmbeddedSource("camera", "CC0 (Lav Varshney)",
                   ("a man with a camera on a tripod", "a photographer on a lawn", "a cameraman"), grey=True),
    EmbeddedSource("chelsea", "CC0 (Stefan van der Walt)", ("a cat", "a tabby cat", "the face of a cat")),
    EmbeddedSource("clock", "public domain (Stefan van der Walt)",
                   ("a motion-blurred clock", "a blurred wall clock", "a clock on a wall"), grey=True),
    EmbeddedSource("coffee", "CC0 (Rachel Michetti)",
                   ("a cup of coffee", "an espresso cup on a saucer", "a red coffee cup")),
    EmbeddedSource("grass", "CC0 (DeviantArt, linolafett)", ("grass", "a patch of grass", "blades of grass"), grey=True),
    EmbeddedSource("gravel", "CC0 (CC0Textures)", ("gravel", "small stones", "a gravel path"), grey=True),
    EmbeddedSource("hubble_deep_field", "public domain (NASA)",
                   ("distant galaxies", "the hubble deep field", "galaxies in deep space")),
    EmbeddedSource("retina", "CC0 (Mikael Haggstrom)",
                   ("a human retina", "the back of an eye", "a fundus photo of an eye")),
    EmbeddedSource("rocket", "public domain (SpaceX)",
                   ("a rocket on the launch pad", "a falcon 9 rocket at night", "a rocket between launch towers")),
)


@dataclass(frozen=True, eq=False)
class DatasetIndex:
    """What a dataset holds: one row per usable image, metadata in NumPy arrays.

    Attributes
    ----------
    root : pathlib.Path
        The dataset folder.
    paths : numpy.ndarray
        Shape (N,), NumPy unicode (``<U...``): absolute file paths.
    captions : numpy.ndarray
        Shape (N,), NumPy unicode: one caption per image.
    labels : numpy.ndarray
        Shape (N,), int64, each in ``[0, n_classes)``.
    n_classes : int
        Number of classes (size of a classifier head over ``labels``).
    skipped : tuple of BadFile
        Files found but not used, each with a reason.
    class_names : tuple of str
        Name of each class, indexed by label (may be empty when labels are
        bare integers from a captions file).
    found : int
        Candidate image files found (before ``max_images`` and the check);
        0 when the index was not made by :func:`load_dataset`.
    """

    root: Path
    paths: np.ndarray
    captions: np.ndarray
    labels: np.ndarray
    n_classes: int
    skipped: tuple[BadFile, ...] = ()
    class_names: tuple[str, ...] = field(default=())
    found: int = 0

    def __len__(self) -> int:
        return int(self.paths.shape[0])

    def subset(self, n: int, *, seed: int = 0) -> "DatasetIndex":
        """Return at most ``n`` images, drawn without replacement, in their original order.

        The draw is a seeded permutation, so every class keeps about its share
        (taking the first ``n`` files could leave some classes out).

        Parameters
        ----------
        n : int
            Number of images wanted (>= 1). ``n >= len(self)`` returns ``self``.
        seed : int
            Seed of the draw.

        Raises
        ------
        DataError
            If ``n < 1``.
        """
        if n < 1:
            raise DataError(f"subset size must be >= 1, got {n}")
        if n >= len(self):
            return self
        keep = np.sort(np.random.default_rng(seed).permutation(len(self))[:n])
        return DatasetIndex(root=self.root, paths=self.paths[keep], captions=self.captions[keep],
                            labels=self.labels[keep], n_classes=self.n_classes, skipped=self.skipped,
                            class_names=self.class_names, found=self.found)

    def frame(self):
        """Return the index as a table.

        Returns
        -------
        pandas.DataFrame
            Columns ``path`` (str), ``caption`` (str), ``label`` (int64); one
            row per usable image.
        """
        import pandas as pd

        return pd.DataFrame(
            {"path": self.paths.astype(str), "caption": self.captions.astype(str), "label": self.labels},
            columns=["path", "caption", "label"],
        )


def check_batch_fits(index: DatasetIndex, batch_size: int) -> None:
    """Fail early when a dataset cannot fill one batch.

    Parameters
    ----------
    index : DatasetIndex
    batch_size : int
        Samples per training step.

    Raises
    ------
    DataError
        If ``len(index) < batch_size``; the message gives both numbers, the
        skipped files, and the two ways out.
    """
    if len(index) < batch_size:
        skipped = f" ({len(index.skipped)} more file(s) were skipped as unreadable)" if index.skipped else ""
        raise DataError(
            f"the dataset in {index.root} has {len(index)} usable image(s){skipped}, fewer than "
            f"batch_size={batch_size}: lower batch_size (a notebook parameter; for `python -m helpers run` or "
            "`bench`, set it in notebooks/profiles/<profile>.yaml) or add images"
        )


# --------------------------------------------------------------------------- embedded build


@dataclass(frozen=True)
class _Plan:
    """Everything random about one embedded image, drawn up front."""

    index: int
    label: int
    box: tuple[int, int, int, int]  # left, top, right, bottom in source pixels
    size: tuple[int, int]  # output width, height
    flip: bool
    quality: int
    progressive: bool
    caption: str


def _load_sources():
    """Load every source photo as an RGB Pillow image (grey replicated)."""
    from PIL import Image
    from skimage import data

    images = []
    for src in EMBEDDED_SOURCES:
        arr = np.asarray(getattr(data, src.name)())
        if arr.ndim == 2:
            arr = np.repeat(arr[:, :, None], 3, axis=2)
        images.append(Image.fromarray(np.ascontiguousarray(arr[:, :, :3]), "RGB"))
    return images


def _where(box, width: int, height: int, area: float) -> str:
    """Say in words which part of the source a crop shows."""
    if area > 0.85:
        return ""
    dx = ((box[0] + box[2]) / 2 - width / 2) / width
    dy = ((box[1] + box[3]) / 2 - height / 2) / height
    horiz = "left" if dx < -0.05 else "right" if dx > 0.05 else ""
    vert = "top" if dy < -0.05 else "bottom" if dy > 0.05 else ""
    part = " ".join(p for p in (vert, horiz) if p) or "center"
    return f", cropped from the {part}"


def _plan(n_images: int, seed: int, sizes: list[tuple[int, int]]) -> list[_Plan]:
    """Draw every image's crop, size, flip, quality and caption from one Generator."""
    rng = np.random.default_rng(seed)
    n_sources = len(EMBEDDED_SOURCES)
    labels = rng.permutation(np.arange(n_images) % n_sources)  # balanced classes
    plans = []
    for i in range(n_images):
        label = int(labels[i])
        src = EMBEDDED_SOURCES[label]
        width, height = sizes[label]
        # Fixed order of draws, whatever branch is taken below.
        area = float(rng.uniform(*_AREA))
        aspect = float(np.exp(rng.uniform(np.log(_ASPECT[0]), np.log(_ASPECT[1]))))
        fx, fy = float(rng.random()), float(rng.random())
        flip = bool(rng.random() < _FLIP_P)
        long_side = int(rng.integers(_LONG_SIDE[0], _LONG_SIDE[1] + 1))
        quality = int(rng.integers(_QUALITY[0], _QUALITY[1] + 1))
        progressive = bool(rng.random() < _PROGRESSIVE_P)
        noun = src.nouns[int(rng.integers(len(src.nouns)))]

        cw = min(width, max(16, round(np.sqrt(area * width * height * aspect))))
        ch = min(height, max(16, round(np.sqrt(area * width * height / aspect))))
        left = int(fx * (width - cw + 1))
        top = int(fy * (height - ch + 1))
        box = (left, top, left + cw, top + ch)
        scale = long_side / max(cw, ch)
        size = (max(1, round(cw * scale)), max(1, round(ch * scale)))
        kept = cw * ch / (width * height)
        view = "a close-up photo" if kept < 0.5 else "a wide photo" if kept > 0.85 else "a photo"
        if src.grey:
            view = view.replace("photo", "black-and-white photo")
        caption = f"{view} of {noun}{_where(box, width, height, kept)}" + (", mirrored" if flip else "")
        plans.append(_Plan(i, label, box, size, flip, quality, progressive, caption))
    return plans


def _render(plan: _Plan, source) -> bytes:
    """Crop, scale, flip and JPEG-encode one planned image."""
    from PIL import Image

    im = source.resize(plan.size, Image.Resampling.BICUBIC, box=plan.box)
    if plan.flip:
        im = im.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    buf = io.BytesIO()
    im.save(buf, "JPEG", quality=plan.quality, progressive=plan.progressive, optimize=False)
    return buf.getvalue()


def _build_info(n_images: int, seed: int) -> dict:
    import PIL
    from PIL import features

    return {
        "builder_version": BUILDER_VERSION,
        "n_images": n_images,
        "seed": seed,
        "n_classes": len(EMBEDDED_SOURCES),
        "sources": [
            {"label": i, "name": s.name, "license": s.license, "grey": s.grey} for i, s in enumerate(EMBEDDED_SOURCES)
        ],
        "encoder": {"pillow": PIL.__version__, "libjpeg_turbo": features.version("libjpeg_turbo")},
    }


def _check_build_args(n_images, seed) -> None:
    if isinstance(n_images, bool) or not isinstance(n_images, (int, np.integer)) or n_images < 1:
        raise ParameterError(f"n_images must be a positive integer, got {n_images!r}; e.g. 512 (or 64 for a smoke run)")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ParameterError(f"seed must be a non-negative integer, got {seed!r}; e.g. 0")


def build_embedded(out_dir: Path, *, n_images: int = 512, seed: int = 0) -> Path:
    """Build the embedded photo dataset into an empty folder.

    Writes ``images/00000.jpg ...``, ``manifest.csv`` (columns ``file,
    caption, label, source, width, height, quality, progressive``) and, last,
    ``BUILD_INFO.json`` (seed, n_images, builder version, sources with their
    licences, encoder versions). Same arguments and library versions give
    byte-identical files. Output images are 256 to 1024 px on the long side,
    JPEG quality 60 to 95, about 1 in 4 progressive, 4:2:0 chroma
    subsampling (Pillow's default).

    Parameters
    ----------
    out_dir : pathlib.Path
        Folder to write; created if missing, must be empty if it exists.
    n_images : int, default 512
        Number of images; labels are balanced over the sources.
    seed : int, default 0
        Seed of the ``numpy.random.Generator`` that draws every random choice.

    Returns
    -------
    pathlib.Path
        ``out_dir``.

    Raises
    ------
    ParameterError
        If ``n_images`` or ``seed`` is not a valid integer.
    OutputDirError
        If ``out_dir`` exists and is not an empty folder, or cannot be written.
    """
    _check_build_args(n_images, seed)
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise OutputDirError(
            f"cannot build the embedded dataset into {out}: it exists and is not an empty folder; "
            "remove it, pass a new folder, or use ensure_embedded() which rebuilds safely"
        )
    started = time.perf_counter()
    try:
        (out / "images").mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputDirError(f"cannot create {out / 'images'}: {exc}; pass a writable folder") from exc
    sources = _load_sources()
    plans = _plan(int(n_images), int(seed), [im.size for im in sources])

    def write(plan: _Plan) -> None:
        (out / "images" / f"{plan.index:05d}.jpg").write_bytes(_render(plan, sources[plan.label]))

    with ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1), thread_name_prefix="build_embedded") as pool:
        list(pool.map(write, plans))  # Pillow releases the GIL while resizing and encoding

    with open(out / "manifest.csv", "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh, lineterminator="\n")
        writer.writerow(_MANIFEST_COLUMNS)
        for p in plans:
            writer.writerow([f"images/{p.index:05d}.jpg", p.caption, p.label, EMBEDDED_SOURCES[p.label].name,
                             p.size[0], p.size[1], p.quality, int(p.progressive)])
    info = _build_info(int(n_images), int(seed))
    info["file_bytes"] = {f"images/{p.index:05d}.jpg": (out / "images" / f"{p.index:05d}.jpg").stat().st_size
                          for p in plans}
    (out / "BUILD_INFO.json").write_text(json.dumps(info, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    logger.info("built embedded dataset: %d images in %s (%.1f s)", n_images, out, time.perf_counter() - started)
    return out


def default_data_root() -> Path:
    """Folder that holds generated data.

    Returns
    -------
    pathlib.Path
        ``$WORKBOOK_DATA_DIR`` when that variable is set and not empty, else
        ``<repo>/data/generated`` in a checkout (:func:`helpers.fsutil.in_checkout`),
        else (an installed wheel)
        ``platformdirs.user_cache_dir("training-perf-workbook")/data``.
    """
    env = os.environ.get(DATA_DIR_ENV, "").strip()
    if env:
        return Path(env).expanduser()
    if in_checkout():
        return repo_root() / "data" / "generated"
    import platformdirs  # an installed wheel: nothing is written inside site-packages

    return Path(platformdirs.user_cache_dir("training-perf-workbook")) / "data"


def _is_current_build(folder: Path, n_images: int, seed: int) -> bool:
    try:
        info = json.loads((folder / "BUILD_INFO.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if not (
        info.get("builder_version") == BUILDER_VERSION
        and info.get("n_images") == n_images
        and info.get("seed") == seed
        and (folder / "manifest.csv").is_file()
    ):
        return False
    # A file deleted or truncated since the build (a damaged copy) triggers a rebuild.
    damaged = []
    for rel, size in (info.get("file_bytes") or {}).items():
        try:
            if (folder / rel).stat().st_size != size:
                damaged.append(rel)
        except OSError:
            damaged.append(rel)
    if damaged or not info.get("file_bytes"):
        logger.warning("embedded dataset %s is damaged (%d file(s) missing or changed, e.g. %s); rebuilding",
                       folder, len(damaged), damaged[:3])
        return False
    return True


def ensure_embedded(n_images: int = 512, seed: int = 0, root: Path | str | None = None) -> Path:
    """Return the embedded dataset folder, building it if needed.

    The folder is ``<root>/embedded-n<n_images>-seed<seed>``. It is (re)built
    when missing or when its ``BUILD_INFO.json`` does not match ``n_images``,
    ``seed`` and :data:`BUILDER_VERSION`. The build goes to a temporary folder
    beside it, then is renamed into place, so two processes that race both
    end up with one complete folder.

    Parameters
    ----------
    n_images : int, default 512
    seed : int, default 0
    root : pathlib.Path or str, optional
        Parent folder; default :func:`default_data_root`.

    Returns
    -------
    pathlib.Path
        The dataset folder.

    Raises
    ------
    ParameterError
        If ``n_images`` or ``seed`` is invalid.
    OutputDirError
        If ``root`` cannot be created or written.
    """
    _check_build_args(n_images, seed)
    n_images, seed = int(n_images), int(seed)
    base = Path(root).expanduser() if root else default_data_root()
    target = base / f"embedded-n{n_images}-seed{seed}"
    if _is_current_build(target, n_images, seed):
        return target
    try:
        base.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.building-", dir=base))
    except OSError as exc:
        raise OutputDirError(
            f"cannot write the embedded dataset under {base}: {exc}; set {DATA_DIR_ENV} to a writable folder"
        ) from exc
    try:
        build_embedded(tmp, n_images=n_images, seed=seed)
        if target.exists() and not _is_current_build(target, n_images, seed):
            stale = Path(tempfile.mkdtemp(prefix=f".{target.name}.stale-", dir=base))
            try:
                os.rename(target, stale / "old")
                logger.info("replacing stale embedded dataset at %s", target)
            except FileNotFoundError:
                pass  # another process moved it first
            shutil.rmtree(stale, ignore_errors=True)
        try:
            os.rename(tmp, target)
        except OSError:
            if not _is_current_build(target, n_images, seed):
                raise
            logger.info("another process built %s first; using its copy", target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


# --------------------------------------------------------------------------- indexes


def _stem_caption(rel: PurePosixPath) -> str:
    """Caption from a file's folder and stem: 'cats/IMG_0042.jpg' -> 'cats img 0042'."""
    parts = list(rel.parent.parts) + [rel.stem]
    words = [w for part in parts for w in re.split(r"[^0-9A-Za-z]+", part.lower()) if w]
    return " ".join(words) or "an image"


def _labels_from_names(names: list[str]) -> tuple[np.ndarray, tuple[str, ...]]:
    classes = tuple(sorted(set(names)))
    lookup = {c: i for i, c in enumerate(classes)}
    return np.array([lookup[n] for n in names], dtype=np.int64), classes


def _sample_and_check(root: Path, rels: list[str], max_images: int, seed: int, scan: bool,
                      use_cache: bool, progress: bool | None) -> tuple[np.ndarray, list[BadFile]]:
    """Indices of the files to keep (sorted) and the bad files met, checking no more files than needed.

    Without ``max_images`` every candidate is checked. With it, candidates are
    taken in a seeded random order, ``max_images`` at a time, and checked
    until ``max_images`` usable files are found or the candidates run out: the
    work is bounded by the sample, not by the folder.
    """
    n = len(rels)
    if max_images and max_images < n:
        order = np.random.default_rng(seed).permutation(n)
    else:
        order = np.arange(n)
    want = max_images if max_images else n
    if not scan:
        return np.sort(order[:want]), []
    kept: list[int] = []
    bad: list[BadFile] = []
    pos = 0
    while len(kept) < want and pos < n:
        take = order[pos:pos + max(want - len(kept), 1)]
        pos += len(take)
        reasons, _ = scan_relative(root, [rels[i] for i in take], use_cache=use_cache, progress=progress)
        for i, reason in zip(take, reasons):
            if reason is None:
                kept.append(int(i))
            else:
                bad.append(BadFile(root / rels[i], reason))
    return np.sort(np.array(kept[:want], dtype=np.int64)), bad


def _finish(root: Path, rels: list[str], captions: list[str], labels: np.ndarray, n_classes: int,
            class_names: tuple[str, ...], skipped: list[BadFile], scan: bool, *, max_images: int = 0,
            sample_seed: int = 0, use_cache: bool = True, progress: bool | None = None) -> DatasetIndex:
    """Check the candidates (a bounded sample of them with ``max_images``), drop the bad ones, build the index.

    ``rels`` are the candidate files relative to ``root`` (``/`` separated).
    """
    idx, bad = _sample_and_check(root, rels, max_images, sample_seed, scan, use_cache, progress) if rels else (
        np.zeros(0, dtype=np.int64), [])
    skipped = skipped + bad
    if idx.size == 0:
        first = "; ".join(f"{b.path.name}: {b.reason}" for b in skipped[:5])
        raise DataError(
            f"no decodable image in {root} ({len(rels)} candidate files; first reasons: {first}); "
            "replace the bad files or pass another folder"
        )
    if skipped:
        logger.warning("%s: %d file(s) skipped (see DatasetIndex.skipped)", root, len(skipped))
    base = str(root)
    return DatasetIndex(
        root=root,
        paths=np.array([os.path.join(base, rels[i]) for i in idx], dtype=np.str_),
        captions=np.array([captions[i] for i in idx], dtype=np.str_),
        labels=np.asarray(labels, dtype=np.int64)[idx],
        n_classes=int(n_classes),
        skipped=tuple(skipped),
        class_names=tuple(class_names),
        found=len(rels),
    )


def _load_embedded_folder(root: Path, scan: bool, **sample) -> DatasetIndex:
    info = json.loads((root / "BUILD_INFO.json").read_text(encoding="utf-8"))
    with open(root / "manifest.csv", newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    rels = [PurePosixPath(r["file"]).as_posix() for r in rows]
    captions = [r["caption"] for r in rows]
    labels = np.array([int(r["label"]) for r in rows], dtype=np.int64)
    names = tuple(s["name"] for s in info["sources"])
    return _finish(root, rels, captions, labels, info["n_classes"], names, [], scan, **sample)


def _walk(root: Path) -> tuple[list[str], set[str]]:
    """Image files and ``.txt`` files under ``root``, relative and ``/`` separated; images sorted.

    One ``os.walk`` (no ``stat`` per file; hidden folders such as
    ``.ipynb_checkpoints`` are not entered), so listing a million files costs
    seconds, not minutes; the ``.txt`` set answers the sidecar-caption
    question without a ``stat`` per image.
    """
    images: list[str] = []
    texts: set[str] = set()
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        rel_dir = os.path.relpath(dirpath, root).replace(os.sep, "/")
        prefix = "" if rel_dir == "." else rel_dir + "/"
        for name in filenames:
            if name.startswith("."):
                continue  # macOS ._ files, editor droppings
            ext = os.path.splitext(name)[1].lower()
            if ext in IMAGE_SUFFIXES:
                images.append(prefix + name)
            elif ext == ".txt":
                texts.add(prefix + name)
    images.sort()
    return images, texts


def list_image_files(root: Path) -> list[Path]:
    """Image files under ``root``, recursive, sorted by relative path; hidden entries skipped.

    Parameters
    ----------
    root : pathlib.Path
        The folder (the returned paths are ``root / relative path``).

    Returns
    -------
    list of pathlib.Path
        Files whose suffix is one of :data:`~helpers.pipeline.images.IMAGE_SUFFIXES`
        (any case), not starting with ``.`` and not inside a folder starting with ``.``.
    """
    return [root / rel for rel in _walk(root)[0]]


def _read_captions_file(root: Path) -> tuple[str, dict[str, dict]] | None:
    """Read captions.csv or captions.jsonl; return (file name, {relative path: row})."""
    csv_path, jsonl_path = root / "captions.csv", root / "captions.jsonl"
    rows: list[dict] = []
    if csv_path.is_file():
        if jsonl_path.is_file():
            logger.warning("%s: both captions.csv and captions.jsonl exist; using captions.csv", root)
        with open(csv_path, newline="", encoding="utf-8-sig") as fh:
            reader = csv.DictReader(fh)
            missing = {"file", "caption"} - set(reader.fieldnames or ())
            if missing:
                raise DataError(
                    f"{csv_path} lacks column(s) {sorted(missing)} (columns seen: {reader.fieldnames}); "
                    "its header must be file,caption or file,caption,label"
                )
            rows = [dict(r) for r in reader]
        name = "captions.csv"
    elif jsonl_path.is_file():
        with open(jsonl_path, encoding="utf-8") as fh:
            for n, line in enumerate(fh, start=1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except ValueError as exc:
                    raise DataError(f"{jsonl_path} line {n} is not JSON ({exc}); write one object per line") from exc
                if not isinstance(obj, dict) or "file" not in obj or "caption" not in obj:
                    raise DataError(
                        f"{jsonl_path} line {n} must be an object with keys 'file' and 'caption', got {line.strip()[:80]!r}"
                    )
                rows.append(obj)
        name = "captions.jsonl"
    else:
        return None
    table: dict[str, dict] = {}
    for row in rows:
        key = PurePosixPath(str(row["file"]).replace("\\", "/")).as_posix()
        table[key] = row
    return name, table


def _outside(root: Path, name: str) -> bool:
    """True when a captions file's ``name`` (``/`` separated) leads out of ``root``: ``../x.jpg``, ``/elsewhere/x.jpg``."""
    base = posixpath.normpath(root.as_posix())
    target = posixpath.normpath(posixpath.join(base, name))
    return target != base and not target.startswith(base.rstrip("/") + "/")


def _load_user_folder(root: Path, scan: bool, **sample) -> DatasetIndex:
    rel_names, texts = _walk(root)
    if not rel_names:
        raise DataError(
            f"no image files in {root} (looked recursively for {', '.join(IMAGE_SUFFIXES)}); "
            "put images there, or pass None for the embedded dataset"
        )
    if scan and sample.get("use_cache", True):
        prune_cache(root, rel_names)  # files gone from the folder leave the cache
    rels = [PurePosixPath(r) for r in rel_names]
    table_info = _read_captions_file(root)
    table_name, table = table_info if table_info else ("", {})
    if table:
        unknown = sorted(set(table) - set(rel_names))
        outside = [k for k in unknown if _outside(root, k)]
        missing = [k for k in unknown if k not in set(outside)]
        if outside:
            logger.warning("%s lists %d file(s) outside the folder %s, ignored (only files inside it are read), "
                           "e.g. %s", table_name, len(outside), root, outside[:3])
            table = {k: row for k, row in table.items() if k not in set(outside)}  # their labels do not count
        if missing:
            logger.warning("%s lists %d file(s) not found as images under %s, e.g. %s (paths are relative to the "
                           "folder, / separated)", table_name, len(missing), root, missing[:3])

    captions = []
    for name, rel in zip(rel_names, rels):
        row = table.get(name)
        text = str(row["caption"]).strip() if row and row.get("caption") is not None else ""
        if not text:
            sidecar = os.path.splitext(name)[0] + ".txt"
            if sidecar in texts:
                text = " ".join((root / sidecar).read_text(encoding="utf-8", errors="replace").split())
        captions.append(text or _stem_caption(rel))

    skipped: list[BadFile] = []
    has_labels = any(str(row.get("label", "") or "").strip() for row in table.values())
    if has_labels:
        empty = [k for k, row in table.items() if not str(row.get("label", "") or "").strip()]
        if empty:
            raise DataError(
                f"{root / table_name}: the label is empty for {len(empty)} file(s), e.g. {empty[:3]}; "
                "fill every label or remove the label column"
            )
        listed = [name in table for name in rel_names]
        for name, ok in zip(rel_names, listed):
            if not ok:
                skipped.append(BadFile(root / name, f"no label: not listed in {table_name}, which gives labels"))
        rel_names = [r for r, ok in zip(rel_names, listed) if ok]
        captions = [c for c, ok in zip(captions, listed) if ok]
        rels = [r for r, ok in zip(rels, listed) if ok]
        raw = [str(table[name]["label"]).strip() for name in rel_names]
        if raw and all(re.fullmatch(r"\d+", v) for v in raw):
            labels = np.array([int(v) for v in raw], dtype=np.int64)
            return _finish(root, rel_names, captions, labels, int(labels.max()) + 1, (), skipped, scan, **sample)
        labels, classes = _labels_from_names(raw)
        return _finish(root, rel_names, captions, labels, len(classes), classes, skipped, scan, **sample)

    tops = [rel.parts[0] if len(rel.parts) > 1 else "" for rel in rels]
    if any(tops):
        if not all(tops):
            logger.warning("%s: images both at the top level and in subfolders; top-level ones get class ''", root)
        labels, classes = _labels_from_names(tops)
        return _finish(root, rel_names, captions, labels, len(classes), classes, skipped, scan, **sample)
    return _finish(root, rel_names, captions, np.zeros(len(rel_names), dtype=np.int64), 1, ("",), skipped, scan, **sample)


def load_dataset(
    data_dir: str | os.PathLike | None = None, *, scan: bool = True, n_images: int = 512, seed: int = 0,
    max_images: int = 0, sample_seed: int = 0, use_cache: bool = True, progress: bool | None = None,
) -> DatasetIndex:
    """Index a dataset: the embedded one, or a folder of images.

    ``None`` or ``""`` selects the embedded dataset (:func:`ensure_embedded`
    with ``n_images`` and ``seed``). A folder made by :func:`build_embedded`
    is read through its ``manifest.csv``. Any other folder is searched
    recursively for :data:`~helpers.pipeline.images.IMAGE_SUFFIXES` (hidden
    files and folders skipped; sorted by relative path, so the order is the
    same on every machine).

    Captions, per image, from the first that exists: a row of
    ``captions.csv`` (columns ``file,caption[,label]``; ``file`` relative to
    the folder, ``/`` separated) or ``captions.jsonl`` (one
    ``{"file": ..., "caption": ...}`` object per line); a sidecar
    ``<name>.txt`` beside the image; the folder and file name
    (``cats/IMG_0042.jpg`` -> ``"cats img 0042"``).

    Labels: the captions file's ``label`` column when present (integers are
    used as they are, other values are class names numbered in sorted order;
    images not listed there are skipped); else the top-level subfolder name
    (class folders, as ``torchvision.datasets.ImageFolder``), numbered in
    sorted order; else 0.

    Parameters
    ----------
    data_dir : str or os.PathLike, optional
        The folder; None or "" for the embedded dataset.
    scan : bool, default True
        Check every file used (``verify()`` and a full decode, as
        :func:`~helpers.pipeline.images.scan_images`) and skip the bad ones,
        each reported in the log and in ``skipped``. Outcomes are cached per
        file (:func:`helpers.pipeline.scan_cache.cached_scan`), so a folder is
        decoded once, and after a change only its new or changed files are.
    n_images, seed : int
        Size and seed of the embedded dataset (ignored for a folder).
    max_images : int, default 0
        Use at most this many images (0: all). The files are drawn (seeded
        with ``sample_seed``, in folder order afterwards) *before* they are
        checked, so a sample of a large folder checks about ``max_images``
        files, not the folder; bad files in the draw are replaced by further
        draws.
    sample_seed : int, default 0
        Seed of the ``max_images`` draw.
    use_cache : bool, default True
        False checks every file again and leaves the cache alone.
    progress : bool, optional
        Progress bar while files are decoded (default: for 2,000 files or more,
        outside headless runs; see :func:`~helpers.pipeline.scan_cache.cached_scan`).

    Returns
    -------
    DatasetIndex

    Raises
    ------
    DataError
        If the folder is missing, is not a folder, holds no image file, holds
        no decodable image, or has a malformed captions file.
    ParameterError
        If ``n_images`` or ``seed`` is invalid (embedded dataset only).
    """
    if isinstance(max_images, bool) or not isinstance(max_images, int) or max_images < 0:
        raise ParameterError(f"max_images must be an int >= 0 (0 for all images), got {max_images!r}")
    sample = {"max_images": max_images, "sample_seed": int(sample_seed), "use_cache": bool(use_cache),
              "progress": progress}
    if data_dir is None or str(data_dir).strip() == "":
        return _load_embedded_folder(ensure_embedded(n_images=n_images, seed=seed), scan, **sample)
    root = Path(data_dir).expanduser()
    if not root.exists():
        raise DataError(
            f"dataset folder {root} does not exist; pass an existing folder of images, "
            "or None (or '') for the embedded dataset"
        )
    if not root.is_dir():
        raise DataError(f"dataset path {root} is not a folder; pass the folder that holds the images, not a file")
    root = root.resolve()
    if (root / "BUILD_INFO.json").is_file() and (root / "manifest.csv").is_file():
        return _load_embedded_folder(root, scan, **sample)
    return _load_user_folder(root, scan, **sample)
