"""Reading a "try it" chart's pixels: how many bars it draws, so a blank or bar-less chart fails a test.

The panel's chart (:func:`helpers.workbook.plots.live_points`) draws the notebook's own result as a grey bar
(``#bbbbbb``) and each live point as a green bar (``#1b9e77``), hatched when the machine was busy. A bar is a run
of adjacent pixel columns each holding at least ``MIN_BAR_PIXELS`` pixels that start a solid ``CORE`` x ``CORE``
block of its colour; text, ticks and the dashed reference line (``#666666``) are other colours or never that
solid. A white (blank) chart has no bar at all.
"""

from __future__ import annotations

import io

#: The bar colours of helpers.workbook.plots.live_points, as RGB.
LIVE_RGB = (0x1B, 0x9E, 0x77)
REFERENCE_RGB = (0xBB, 0xBB, 0xBB)
#: Per-channel distance within which a pixel counts as a bar's colour (anti-aliased edges fall outside).
TOLERANCE = 12
#: Pixels starting such a block that a column needs to count as part of a bar, and columns a bar needs (at dpi
#: 100 a bar is tens of pixels wide).
MIN_BAR_PIXELS = 3
MIN_BAR_COLUMNS = 6
#: Side of the solid block of a bar's colour a pixel must start to count (text never fills one).
CORE = 4


#: A gap this narrow inside a bar is its error bar (a dark line down the bar's middle, widened by the block test),
#: not the space between bars (a fifth of a bar's pitch: about 20 pixels or more at dpi 100).
MAX_GAP_IN_BAR = 10


def _runs(columns: list[int]) -> int:
    filled = [n >= MIN_BAR_PIXELS for n in columns]
    runs, width, gap = 0, 0, 0
    for on in filled + [False] * (MAX_GAP_IN_BAR + 1):
        if on:
            width, gap = width + gap + 1, 0
            continue
        if width:
            gap += 1
            if gap > MAX_GAP_IN_BAR:
                runs += width >= MIN_BAR_COLUMNS
                width, gap = 0, 0
    return runs


def bars(png: bytes) -> dict[str, int]:
    """Count the bars a chart PNG draws: ``{"live": n, "reference": n, "width": px, "height": px}``.

    Parameters
    ----------
    png : bytes
        A PNG (the panel's figure, or a browser screenshot of the chart element).
    """
    import numpy as np
    from PIL import Image

    rgb = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"), dtype=np.int16)  # (height, width, 3)

    def column_counts(colour) -> list[int]:
        near = (np.abs(rgb - np.array(colour, dtype=np.int16)) <= TOLERANCE).all(axis=2)
        # a pixel is inside a bar where a CORE x CORE block around it is all of the colour: a bar's fill is, the
        # anti-aliased edges of text and lines never are
        core = near.copy()
        for dy in range(CORE):
            for dx in range(CORE):
                core[: near.shape[0] - dy, : near.shape[1] - dx] &= near[dy:, dx:]
        return core.sum(axis=0).tolist()

    return {"live": _runs(column_counts(LIVE_RGB)), "reference": _runs(column_counts(REFERENCE_RGB)),
            "width": int(rgb.shape[1]), "height": int(rgb.shape[0])}
