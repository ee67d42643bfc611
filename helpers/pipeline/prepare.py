"""The data a timed run needs, loaded the same way by every benchmark."""

from __future__ import annotations

from helpers.pipeline.dataset import check_batch_fits, load_dataset
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
