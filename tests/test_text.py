"""Tests of the caption tokenizer."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from helpers.errors import DataError, ParameterError
from helpers.pipeline.dataset import DatasetIndex
from helpers.pipeline.text import (
    PAD_ID,
    build_tokenizer,
    encode_batch,
    encode_one,
    load_or_build_tokenizer,
)

REPO = Path(__file__).resolve().parent.parent
CAPTIONS = [
    f"a {view} photo of {thing}{where}"
    for view in ("close-up", "wide", "black-and-white")
    for thing in ("a cat", "a tabby cat", "a rocket on the launch pad", "distant galaxies", "a cup of coffee")
    for where in ("", ", cropped from the left", ", cropped from the top right, mirrored")
]


def _index(root: Path, captions=CAPTIONS) -> DatasetIndex:
    n = len(captions)
    return DatasetIndex(
        root=root,
        paths=np.array([str(root / f"{i}.jpg") for i in range(n)]),
        captions=np.array(captions),
        labels=np.zeros(n, dtype=np.int64),
        n_classes=1,
    )


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer(CAPTIONS, vocab_size=128, text_len=16)


def test_special_tokens_have_fixed_ids(tokenizer):
    assert tokenizer.token_to_id("[PAD]") == PAD_ID == 0
    assert tokenizer.token_to_id("[UNK]") == 1
    assert tokenizer.get_vocab_size() <= 128


def test_encode_one_pads_with_zero_and_truncates(tokenizer):
    short = encode_one(tokenizer, "a cat", 16)
    assert short.shape == (16,) and short.dtype == np.int64
    mask = short == PAD_ID
    assert not mask[:2].any() and mask[2:].all()  # "a", "cat", then padding
    long = encode_one(tokenizer, " ".join(["cat"] * 40), 16)
    assert long.shape == (16,) and not (long == PAD_ID).any()
    assert encode_one(tokenizer, "a cat", 4).shape == (4,)


def test_normalizer_lowercases_and_strips_accents(tokenizer):
    assert np.array_equal(encode_one(tokenizer, "A CAT", 16), encode_one(tokenizer, "a cat", 16))
    assert np.array_equal(encode_one(tokenizer, "a càt", 16), encode_one(tokenizer, "a cat", 16))


def test_unknown_characters_map_to_unk_not_padding(tokenizer):
    ids = encode_one(tokenizer, "a ☃ cat", 16)
    assert 1 in ids.tolist()
    assert int((ids != PAD_ID).sum()) == 3


def test_batch_encoding_equals_per_sample(tokenizer):
    texts = CAPTIONS + ["", "A CÀT ☃", " ".join(["galaxies"] * 30), "zebra quagga okapi"]
    for text_len in (16, 5, 40):
        batch = encode_batch(tokenizer, texts, text_len)
        assert batch.shape == (len(texts), text_len) and batch.dtype == np.int64
        singles = np.stack([encode_one(tokenizer, t, text_len) for t in texts])
        assert np.array_equal(batch, singles)
    assert encode_batch(tokenizer, [], 16).shape == (0, 16)
    assert np.array_equal(encode_batch(tokenizer, np.array(texts), 16), encode_batch(tokenizer, texts, 16))


def test_training_is_deterministic_across_processes():
    script = textwrap.dedent(
        f"""
        import hashlib, sys
        sys.path.insert(0, {str(REPO)!r})
        from helpers.pipeline.text import build_tokenizer
        caps = {CAPTIONS!r}
        print(hashlib.sha256(build_tokenizer(caps, vocab_size=96).to_str().encode()).hexdigest())
        """
    )
    digests = {subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
               for _ in range(3)}
    assert len(digests) == 1


def test_cache_next_to_embedded_dataset(tmp_path):
    (tmp_path / "BUILD_INFO.json").write_text("{}")
    first = load_or_build_tokenizer(_index(tmp_path), text_len=12)
    cached = sorted(tmp_path.glob("tokenizer-*.json"))
    assert len(cached) == 1
    again = load_or_build_tokenizer(_index(tmp_path), text_len=12)
    assert again.to_str() == first.to_str()
    assert np.array_equal(encode_batch(again, CAPTIONS, 12), encode_batch(first, CAPTIONS, 12))
    other = load_or_build_tokenizer(_index(tmp_path, CAPTIONS[:5]), text_len=12)
    assert len(sorted(tmp_path.glob("tokenizer-*.json"))) == 2  # other captions, other cache file
    assert other.get_vocab_size() <= first.get_vocab_size()


def test_cache_for_user_data_goes_to_the_data_root(tmp_path, monkeypatch):
    user, data_root = tmp_path / "photos", tmp_path / "root"
    user.mkdir()
    monkeypatch.setenv("WORKBOOK_DATA_DIR", str(data_root))
    tok = load_or_build_tokenizer(_index(user), text_len=8)
    assert list(user.iterdir()) == []  # the user's folder is not written to
    assert len(list((data_root / "tokenizers").glob("tokenizer-*.json"))) == 1
    assert encode_one(tok, "a cat", 8).shape == (8,)


def test_explicit_path_and_text_len_of_a_loaded_tokenizer(tmp_path):
    path = tmp_path / "tok.json"
    load_or_build_tokenizer(_index(tmp_path), path=path, text_len=16)
    assert path.is_file()
    loaded = load_or_build_tokenizer(_index(tmp_path), path=path, text_len=6)
    assert encode_batch(loaded, CAPTIONS, 6).shape == (len(CAPTIONS), 6)
    path.write_text("not a tokenizer")
    with pytest.raises(DataError, match="not a tokenizers JSON"):
        load_or_build_tokenizer(_index(tmp_path), path=path)


def test_broken_cache_file_is_rebuilt(tmp_path):
    (tmp_path / "BUILD_INFO.json").write_text("{}")
    load_or_build_tokenizer(_index(tmp_path))
    (cached,) = tmp_path.glob("tokenizer-*.json")
    cached.write_text("{broken")
    tok = load_or_build_tokenizer(_index(tmp_path))
    assert tok.token_to_id("[PAD]") == 0
    assert cached.read_text().startswith("{") and "[PAD]" in cached.read_text()


def test_bad_arguments(tokenizer):
    with pytest.raises(DataError):
        build_tokenizer([])
    with pytest.raises(DataError):
        build_tokenizer(["ok", 3])
    with pytest.raises(ParameterError):
        build_tokenizer(CAPTIONS, vocab_size=4)
    with pytest.raises(ParameterError):
        encode_one(tokenizer, 42, 16)
    with pytest.raises(ParameterError):
        encode_one(tokenizer, "a cat", 0)
    with pytest.raises(ParameterError):
        encode_batch(tokenizer, ["a", None], 16)
