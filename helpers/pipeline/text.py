"""Caption tokenizer of the workload, built with Hugging Face ``tokenizers``.

A small byte-pair-encoding (BPE) tokenizer is trained on the dataset's own
captions: NFD + lowercase + strip-accents normalizer, whitespace-and-
punctuation pre-tokenizer, special tokens ``[PAD]`` (id 0) and ``[UNK]``
(id 1), padding and truncation to a fixed ``text_len``. The model treats
``ids == 0`` as padding (``pad_mask = ids == PAD_ID``).

BPE rather than WordPiece: with tokenizers 0.23 the WordPiece trainer gives
different vocabularies from run to run on the same captions (ties are broken
by hash-map order), while the BPE trainer's output, ids and serialized JSON
alike, is identical across processes; the tests check this.

Two ways to encode, with identical ids (tested): :func:`encode_one`, one
caption per call, as the baseline pipeline does per sample, and
:func:`encode_batch`, one call to ``Tokenizer.encode_batch`` (Rust, several
threads) for a whole batch.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from helpers.errors import DataError, ParameterError
from helpers.fsutil import write_atomic
from helpers.pipeline.dataset import default_data_root
from helpers.workload import DEFAULT

logger = logging.getLogger(__name__)

PAD_TOKEN = "[PAD]"
UNK_TOKEN = "[UNK]"
#: Id of the padding token; ``pad_mask = ids == PAD_ID``.
PAD_ID = 0
#: Version of the tokenizer recipe; part of the cache key.
TOKENIZER_VERSION = 1


def _check_positive_int(name: str, value, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ParameterError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def configure_length(tokenizer, text_len: int):
    """Make ``tokenizer`` pad and truncate every encoding to ``text_len`` ids.

    Does nothing when it is already set that way.

    Parameters
    ----------
    tokenizer : tokenizers.Tokenizer
    text_len : int
        Number of ids per caption, >= 1.

    Returns
    -------
    tokenizers.Tokenizer
        The same object (changed in place).

    Raises
    ------
    ParameterError
        If ``text_len`` is not a positive integer.
    """
    text_len = _check_positive_int("text_len", text_len)
    padding, truncation = tokenizer.padding, tokenizer.truncation
    if not padding or padding.get("length") != text_len or padding.get("pad_id") != PAD_ID:
        tokenizer.enable_padding(pad_id=PAD_ID, pad_token=PAD_TOKEN, length=text_len)
    if not truncation or truncation.get("max_length") != text_len:
        tokenizer.enable_truncation(max_length=text_len)
    return tokenizer


def build_tokenizer(captions: Sequence[str], *, vocab_size: int = 512, text_len: int = DEFAULT.text_len):
    """Train a BPE tokenizer on captions, deterministically.

    Parameters
    ----------
    captions : sequence of str
        Training text, one caption per item.
    vocab_size : int, default 512
        Largest vocabulary (special tokens included); the trainer stops
        earlier when the captions have no more pairs to merge.
    text_len : int, default 16
        Padding and truncation length of every encoding.

    Returns
    -------
    tokenizers.Tokenizer
        ``[PAD]`` has id 0 and ``[UNK]`` id 1.

    Raises
    ------
    DataError
        If ``captions`` is empty or holds something other than strings.
    ParameterError
        If ``vocab_size`` (< 8) or ``text_len`` is invalid.
    """
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

    vocab_size = _check_positive_int("vocab_size", vocab_size, minimum=8)
    text_len = _check_positive_int("text_len", text_len)
    texts = list(captions)
    if not texts:
        raise DataError("no captions to train the tokenizer on; pass at least one caption")
    bad = [t for t in texts if not isinstance(t, str)]
    if bad:
        raise DataError(f"captions must be strings; got {len(bad)} other value(s), e.g. {bad[0]!r}")
    tokenizer = Tokenizer(models.BPE(unk_token=UNK_TOKEN))
    tokenizer.normalizer = normalizers.Sequence(
        [normalizers.NFD(), normalizers.Lowercase(), normalizers.StripAccents()]
    )
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[PAD_TOKEN, UNK_TOKEN], show_progress=False)
    tokenizer.train_from_iterator(texts, trainer=trainer)
    if tokenizer.token_to_id(PAD_TOKEN) != PAD_ID:  # guaranteed by special_tokens order; checked anyway
        raise RuntimeError(f"{PAD_TOKEN} got id {tokenizer.token_to_id(PAD_TOKEN)}, expected {PAD_ID}")
    return configure_length(tokenizer, text_len)


def _cache_key(captions: Sequence[str], vocab_size: int) -> str:
    digest = hashlib.sha256(f"v{TOKENIZER_VERSION}|bpe|{vocab_size}\n".encode())
    for caption in captions:
        digest.update(caption.encode("utf-8"))
        digest.update(b"\n")
    return digest.hexdigest()[:16]


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, text)


def load_or_build_tokenizer(index, path: Path | str | None = None, text_len: int = DEFAULT.text_len, *, vocab_size: int = 512):
    """Load the tokenizer of a dataset from its cache, or build and cache it.

    Parameters
    ----------
    index : helpers.pipeline.dataset.DatasetIndex
        The dataset whose captions train the tokenizer.
    path : pathlib.Path or str, optional
        Where the tokenizer JSON lives: loaded if the file exists, else built
        and written there. Default: ``tokenizer-<key>.json`` in the dataset
        folder for the embedded dataset, or in ``<default_data_root>/tokenizers``
        for a user folder (the user's folder is never written to). ``<key>``
        hashes the captions, ``vocab_size`` and :data:`TOKENIZER_VERSION`,
        so a changed dataset gets a new tokenizer.
    text_len : int, default 16
        Padding and truncation length.
    vocab_size : int, default 512

    Returns
    -------
    tokenizers.Tokenizer

    Raises
    ------
    DataError
        If an explicit ``path`` exists but is not a tokenizer file.
    ParameterError
        If ``text_len`` or ``vocab_size`` is invalid.
    """
    from tokenizers import Tokenizer

    text_len = _check_positive_int("text_len", text_len)
    vocab_size = _check_positive_int("vocab_size", vocab_size, minimum=8)
    captions = [str(c) for c in index.captions]
    explicit = path is not None
    if path is None:
        root = Path(index.root)
        folder = root if (root / "BUILD_INFO.json").is_file() else default_data_root() / "tokenizers"
        path = folder / f"tokenizer-{_cache_key(captions, vocab_size)}.json"
    path = Path(path)
    if path.is_file():
        try:
            return configure_length(Tokenizer.from_file(str(path)), text_len)
        except Exception as exc:
            if explicit:
                raise DataError(
                    f"{path} is not a tokenizers JSON file ({exc}); delete it to rebuild, or pass another path"
                ) from exc
            logger.warning("rebuilding unreadable cached tokenizer %s (%s)", path, exc)
    tokenizer = build_tokenizer(captions, vocab_size=vocab_size, text_len=text_len)
    try:
        _write_atomic(path, tokenizer.to_str())
    except OSError as exc:
        logger.warning("could not cache the tokenizer at %s (%s); it will be rebuilt next time", path, exc)
    return tokenizer


def encode_one(tokenizer, caption: str, text_len: int) -> np.ndarray:
    """Encode one caption (the per-sample way of the baseline pipeline).

    Parameters
    ----------
    tokenizer : tokenizers.Tokenizer
    caption : str
    text_len : int
        Output length; padded with :data:`PAD_ID` or truncated.

    Returns
    -------
    numpy.ndarray
        Shape (text_len,), int64 token ids.

    Raises
    ------
    ParameterError
        If ``caption`` is not a string or ``text_len`` is invalid.
    """
    if not isinstance(caption, str):
        raise ParameterError(f"caption must be a str, got {type(caption).__name__}: {caption!r}")
    configure_length(tokenizer, text_len)
    return np.asarray(tokenizer.encode(caption).ids, dtype=np.int64)


def encode_batch(tokenizer, captions: Sequence[str], text_len: int) -> np.ndarray:
    """Encode many captions with one ``Tokenizer.encode_batch`` call.

    Parameters
    ----------
    tokenizer : tokenizers.Tokenizer
    captions : sequence of str
    text_len : int

    Returns
    -------
    numpy.ndarray
        Shape (N, text_len), int64; row k equals ``encode_one(tokenizer, captions[k], text_len)``.

    Raises
    ------
    ParameterError
        If an item is not a string or ``text_len`` is invalid.
    """
    texts = [str(c) if isinstance(c, np.str_) else c for c in captions]
    for c in texts:
        if not isinstance(c, str):
            raise ParameterError(f"captions must be strings, got {type(c).__name__}: {c!r}")
    configure_length(tokenizer, text_len)
    if not texts:
        return np.zeros((0, int(text_len)), dtype=np.int64)
    return np.asarray([enc.ids for enc in tokenizer.encode_batch(texts)], dtype=np.int64)
