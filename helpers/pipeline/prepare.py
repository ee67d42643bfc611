"""The data a timed run needs, loaded the same way by every benchmark."""

from __future__ import annotations

from helpers.errors import DataError, ParameterError
from helpers.pipeline.dataset import check_batch_fits, load_dataset
from helpers.pipeline.decode import read_header
from helpers.pipeline.text import load_or_build_tokenizer


def prepare_data(data_dir: str | None = None, *, max_images: int = 0, seed: int = 0, batch_size: int,
                 text_len: int):
    """Load a dataset, check that it fills a batch, and get its tokenizer.

    Parameters
    ----------
    data_dir : str or None
        Folder of images; None or "" for the embedded photos.
    max_images : int
        Use at most this many images (0: all), drawn with ``seed`` before the files are checked.
    seed : int
    batch_size : int
        Samples per batch; the dataset must hold at least this many usable images.
    text_len : int
        Caption length in tokens.

    Returns
    -------
    (helpers.pipeline.dataset.DatasetIndex, tokenizers.Tokenizer)

    Raises
    ------
    helpers.errors.DataError
        Missing, empty or undecodable folder, or fewer images than one batch.
    """

    index = load_dataset(data_dir or None, max_images=max_images, sample_seed=seed)
    check_batch_fits(index, batch_size)
    return index, load_or_build_tokenizer(index, text_len=text_len)


def jpeg_bytes(data_dir: str | None = None, *, n: int, max_images: int = 0, seed: int = 0) -> list[bytes]:
    """The first ``n`` files of a notebook's dataset that libjpeg-turbo decodes to RGB, as bytes in memory.

    The data of the notebooks' "The change in code" cells (02, 03): the same files, drawn the same way, as
    :func:`prepare_data`. PNGs and other formats, and CMYK/YCCK JPEGs (the reference path's, notebook 02), are left
    out, so ``simplejpeg.decode_jpeg`` decodes every one.

    Parameters
    ----------
    data_dir : str or None
        Folder of images; None or "" for the embedded photos.
    n : int
        Most files to return (>= 1).
    max_images, seed : int
        As :func:`prepare_data`.

    Returns
    -------
    list of bytes
        Between 1 and ``n`` whole JPEG files, in the dataset's order.

    Raises
    ------
    helpers.errors.ParameterError
        If ``n`` is not a positive int.
    helpers.errors.DataError
        As :func:`helpers.pipeline.dataset.load_dataset`, or when no file of the dataset is such a JPEG.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ParameterError(f"n must be an int >= 1 (files to return), got {n!r}")
    index = load_dataset(data_dir or None, max_images=max_images, sample_seed=seed)
    out: list[bytes] = []
    for path in index.paths:
        with open(path, "rb") as f:
            data = f.read()
        header = read_header(data)
        if header is not None and header.turbo_ok:
            out.append(data)
            if len(out) == n:
                break
    if not out:
        raise DataError(f"no file of {index.root} is a JPEG that libjpeg-turbo decodes to RGB (PNG, CMYK and other "
                        "formats take notebook 02's reference path); point data_dir at a folder with JPEG photos")
    return out
