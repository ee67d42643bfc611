"""Make the small committed image fixtures that break naive loaders.

Run from the repository root::

    python data/make_fixtures.py            # writes data/fixtures/
    python data/make_fixtures.py OUT_DIR    # writes elsewhere

or call ``make_fixtures(out_dir)``. The output is deterministic: two runs with
the same Pillow, NumPy and scikit-image versions give byte-identical files.

Every picture comes from scikit-image's bundled photographs (``chelsea``:
CC0, Stefan van der Walt; ``camera``: CC0, Lav Varshney; ``astronaut``:
public domain, NASA; see each function's docstring in ``skimage.data``).
Nothing is downloaded.

``expected.json`` says, for each file, whether it should decode; for the
decodable ones the expected upright ``[height, width]``, the lossless
reference it must match (``reference``) and the tolerated mean and maximum
absolute error per 8-bit channel value; for the bad ones the start of the
reason that ``helpers.pipeline.images.scan_images`` must give.

Pillow cannot write 48-bit (16 bits per channel) RGB PNGs, so ``rgb16.png``
is written by the small PNG encoder below (stdlib ``zlib`` and ``struct``).
"""

from __future__ import annotations

import io
import json
import struct
import sys
import zlib
from pathlib import Path

import numpy as np

FIXTURES_VERSION = 1

# Upright size of the colour fixtures: wider than tall, so that a missing
# EXIF rotation shows up as a wrong shape.
_WIDTH, _HEIGHT = 96, 64
_PATCH = 16  # side of the pure colour squares, a multiple of the JPEG MCU


def _patched_chelsea() -> np.ndarray:
    """Chelsea the cat, 96x64, with pure red / green / blue 16x16 corners.

    Returns
    -------
    numpy.ndarray
        (64, 96, 3) uint8, RGB. Red at the top-left, green at the top-right,
        blue at the bottom-left corner.
    """
    from PIL import Image
    from skimage import data

    rgb = np.array(Image.fromarray(data.chelsea()).resize((_WIDTH, _HEIGHT), Image.Resampling.BICUBIC))
    rgb[:_PATCH, :_PATCH] = (255, 0, 0)
    rgb[:_PATCH, -_PATCH:] = (0, 255, 0)
    rgb[-_PATCH:, :_PATCH] = (0, 0, 255)
    return rgb


def _camera_grey() -> np.ndarray:
    """The camera photo, 96x72 grey, (72, 96) uint8."""
    from PIL import Image
    from skimage import data

    return np.array(Image.fromarray(data.camera()).resize((96, 72), Image.Resampling.BICUBIC))


def _astronaut_rgba() -> tuple[np.ndarray, np.ndarray]:
    """The astronaut, 64x64, with an alpha channel and its white composite.

    Returns
    -------
    rgba : numpy.ndarray
        (64, 64, 4) uint8. Alpha 255 on the left half, 0 on columns 48..63,
        128 on columns 32..47.
    on_white : numpy.ndarray
        (64, 64, 3) uint8, ``rgba`` composited over white, rounded to nearest.
    """
    from PIL import Image
    from skimage import data

    rgb = np.array(Image.fromarray(data.astronaut()).resize((64, 64), Image.Resampling.BICUBIC))
    alpha = np.full((64, 64), 255, np.uint8)
    alpha[:, 32:48] = 128
    alpha[:, 48:] = 0
    rgba = np.dstack([rgb, alpha])
    a = alpha[:, :, None].astype(np.float64) / 255.0
    on_white = np.rint(rgb * a + 255.0 * (1.0 - a)).astype(np.uint8)
    return rgba, on_white


def _png_rgb16(rgb16: np.ndarray) -> bytes:
    """Encode an (H, W, 3) uint16 array as a 48-bit RGB PNG (no ancillary chunks)."""
    height, width, _ = rgb16.shape

    def chunk(kind: bytes, payload: bytes) -> bytes:
        return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))

    ihdr = struct.pack(">IIBBBBB", width, height, 16, 2, 0, 0, 0)  # 16 bit, colour type 2 (RGB)
    rows = rgb16.astype(">u2").reshape(height, width * 3)
    raw = b"".join(b"\x00" + row.tobytes() for row in rows)  # filter type 0 per row
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")


def _encode(im, fmt: str, **kwargs) -> bytes:
    buf = io.BytesIO()
    im.save(buf, fmt, **kwargs)
    return buf.getvalue()


def _build() -> tuple[dict[str, bytes], dict[str, dict]]:
    """Build every fixture in memory; return (file bytes, expected entries)."""
    from PIL import Image

    files: dict[str, bytes] = {}
    expected: dict[str, dict] = {}

    def good(name, data, height, width, what, reference=None, mean_tol=0.0, max_tol=0):
        files[name] = data
        expected[name] = {
            "decodes": True,
            "height": height,
            "width": width,
            "what": what,
            "reference": reference,
            "max_mean_abs_error": mean_tol,
            "max_abs_error": max_tol,
        }

    def bad(name, data, reason, what):
        files[name] = data
        expected[name] = {"decodes": False, "reason": reason, "what": what}

    rgb = _patched_chelsea()
    rgb_im = Image.fromarray(rgb)
    h, w = rgb.shape[:2]
    good("rgb_patches.png", _encode(rgb_im, "PNG"), h, w,
         "lossless RGB reference: red top-left, green top-right, blue bottom-left")
    jpeg_plain = _encode(rgb_im, "JPEG", quality=90)
    good("rgb_patches.jpg", jpeg_plain, h, w, "baseline RGB JPEG, quality 90",
         "rgb_patches.png", 6.0, 255)
    good("progressive.jpg", _encode(rgb_im, "JPEG", quality=90, progressive=True), h, w,
         "progressive RGB JPEG, quality 90", "rgb_patches.png", 6.0, 255)
    good("cmyk.jpg", _encode(rgb_im.convert("CMYK"), "JPEG", quality=90), h, w,
         "CMYK JPEG (Adobe APP14 marker, inverted CMYK as Photoshop writes it)",
         "rgb_patches.png", 8.0, 255)

    # EXIF orientation: pixels stored rotated, the tag says how to turn them upright.
    # Tag 6 = "rotate 90 degrees clockwise to display": store the upright picture turned
    # 90 degrees counter-clockwise. Tag 8 is the opposite.
    for tag, stored_turn in ((6, Image.Transpose.ROTATE_90), (8, Image.Transpose.ROTATE_270)):
        exif = Image.Exif()
        exif[0x0112] = tag  # Orientation (EXIF 2.32, tag 274)
        good(f"exif_orientation{tag}.jpg",
             _encode(rgb_im.transpose(stored_turn), "JPEG", quality=90, exif=exif.tobytes()), h, w,
             f"pixels stored rotated ({w}x{h} upright, stored {h}x{w}) with EXIF Orientation={tag}",
             "rgb_patches.png", 6.0, 255)

    quantized = rgb_im.quantize(colors=64, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
    good("palette.png", _encode(quantized, "PNG"), h, w, "palette (P) PNG, 64 colours",
         "rgb_patches.png", 10.0, 255)

    grey = _camera_grey()
    gh, gw = grey.shape
    good("grey8.png", _encode(Image.fromarray(grey), "PNG"), gh, gw,
         "8-bit grey (L) PNG: lossless grey reference, replicated into R, G, B")
    good("grey.jpg", _encode(Image.fromarray(grey), "JPEG", quality=90), gh, gw,
         "grey (L) JPEG, one channel", "grey8.png", 4.0, 255)
    # 16-bit grey: the high byte is the 8-bit picture, the low byte is noise-like, so
    # value >> 8 gives grey8.png exactly, while clipping at 255 gives white.
    low = (np.arange(gh * gw, dtype=np.uint32).reshape(gh, gw) * 37 % 256).astype(np.uint16)
    grey16 = (grey.astype(np.uint16) << 8) | low
    good("grey16.png", _encode(Image.fromarray(grey16), "PNG"), gh, gw,
         "16-bit grey (I;16) PNG; high byte = grey8.png", "grey8.png", 0.0, 0)
    rgb16 = (rgb.astype(np.uint16) << 8) | (255 - rgb.astype(np.uint16))
    good("rgb16.png", _png_rgb16(rgb16), h, w,
         "48-bit RGB PNG (written by this script: Pillow cannot write it); high byte = rgb_patches.png",
         "rgb_patches.png", 0.0, 0)

    la = np.dstack([grey, np.where(np.arange(gw)[None, :] < gw // 2, 255, 0).repeat(gh, 0).astype(np.uint8)])
    grey_on_white = grey.copy()
    grey_on_white[:, gw // 2:] = 255
    good("grey_alpha_on_white.png", _encode(Image.fromarray(grey_on_white), "PNG"), gh, gw,
         "lossless reference for grey_alpha.png")
    good("grey_alpha.png", _encode(Image.fromarray(la, "LA"), "PNG"), gh, gw,
         "grey + alpha (LA) PNG: right half transparent, composited on white",
         "grey_alpha_on_white.png", 0.0, 0)

    rgba, on_white = _astronaut_rgba()
    good("rgba.png", _encode(Image.fromarray(rgba, "RGBA"), "PNG"), 64, 64,
         "RGBA PNG: columns 32-47 half transparent, 48-63 transparent, composited on white",
         "rgba_on_white.png", 0.5, 1)
    good("rgba_on_white.png", _encode(Image.fromarray(on_white), "PNG"), 64, 64,
         "lossless reference for rgba.png (white background)")

    floats = (grey.astype(np.float32) / 255.0)[:32, :32]
    bad("float32.tif", _encode(Image.fromarray(floats, "F"), "TIFF"), "unsupported mode F",
        "32-bit float grey TIFF: no correct 8-bit conversion without knowing its range")
    bad("truncated.jpg", jpeg_plain[: len(jpeg_plain) * 6 // 10], "truncated JPEG",
        "rgb_patches.jpg cut to 60% of its bytes")
    png_full = files["rgb_patches.png"]
    bad("truncated.png", png_full[: len(png_full) // 2], "truncated PNG",
        "rgb_patches.png cut to 50% of its bytes")
    bad("zero_bytes.jpg", b"", "zero-byte file", "an empty file named .jpg")
    bad("not_an_image.jpg", b"This is a text file, saved with a .jpg name by mistake.\n",
        "not an image", "a text file named .jpg")
    return files, expected


def make_fixtures(out_dir: str | Path) -> Path:
    """Write the fixture files and ``expected.json`` into ``out_dir``.

    Parameters
    ----------
    out_dir : str or pathlib.Path
        Folder to write (created if missing; files of the same names are
        overwritten, other files are left alone).

    Returns
    -------
    pathlib.Path
        ``out_dir``.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files, expected = _build()
    for name, data in files.items():
        (out / name).write_bytes(data)
    manifest = {
        "version": FIXTURES_VERSION,
        "generator": "data/make_fixtures.py",
        "files": {name: expected[name] for name in sorted(expected)},
    }
    (out / "expected.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return out


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent / "fixtures"
    make_fixtures(target)
    print(f"wrote fixtures to {target}")
