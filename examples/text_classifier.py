"""A text-only job, written as its user writes it: captions tokenized by a word vocabulary built from the data, a
small transformer encoder, cross-entropy and AdamW. Nothing in the model or data code comes from the workbook;
only ``make_job`` hands the pieces to its one-call adapter.

    python -m helpers diagnose --job examples/text_classifier.py:make_job
    python -m helpers run --profile smoke --job examples/text_classifier.py:make_job

The data: ``data_dir/manifest.csv`` (columns ``caption``, ``label``), else the workbook's embedded photos'
captions (built on first use).
"""

from __future__ import annotations

import csv
import re
from collections import Counter
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import Dataset

PAD, UNK = 0, 1


def words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


class Captions(Dataset):
    """(token ids, length ``seq_len``, int64) and the label of each caption."""

    def __init__(self, rows: list[tuple[str, int]], seq_len: int = 16) -> None:
        counts = Counter(w for text, _ in rows for w in words(text))
        self.vocab = {w: i + 2 for i, (w, _) in enumerate(counts.most_common())}
        self.rows, self.seq_len = rows, seq_len
        self.n_classes = max(label for _, label in rows) + 1

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int):
        text, label = self.rows[i]
        ids = [self.vocab.get(w, UNK) for w in words(text)][: self.seq_len]
        ids += [PAD] * (self.seq_len - len(ids))
        return torch.tensor(ids, dtype=torch.long), label


class TinyTransformer(nn.Module):
    def __init__(self, vocab_size: int, n_classes: int, d_model: int = 64, seq_len: int = 16) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, d_model, padding_idx=PAD)
        self.pos = nn.Parameter(torch.zeros(seq_len, d_model))
        layer = nn.TransformerEncoderLayer(d_model, nhead=4, dim_feedforward=2 * d_model, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=2)
        self.head = nn.Linear(d_model, n_classes)

    def forward(self, ids):
        pad = ids == PAD
        h = self.encoder(self.embed(ids) + self.pos, src_key_padding_mask=pad)
        keep = (~pad).unsqueeze(-1).float()
        return self.head((h * keep).sum(1) / keep.sum(1).clamp(min=1.0))


def _rows(data_dir: str | None) -> list[tuple[str, int]]:
    if data_dir:
        root = Path(data_dir)
    else:
        from helpers.pipeline.dataset import ensure_embedded  # the workbook's sample captions, when no folder is given

        root = ensure_embedded()
    with open(root / "manifest.csv", newline="", encoding="utf-8") as f:
        return [(r["caption"], int(r["label"])) for r in csv.DictReader(f)]


def make_job(data_dir: str | None = None, batch_size: int = 32, seed: int = 0, max_images: int = 0):
    from helpers.jobs.supervised import supervised_job

    rows = _rows(data_dir)
    if max_images:
        rows = rows[:max_images]
    dataset = Captions(rows)
    vocab, classes = len(dataset.vocab) + 2, dataset.n_classes
    return supervised_job(dataset, lambda: TinyTransformer(vocab, classes), nn.functional.cross_entropy,
                          lambda params: torch.optim.AdamW(params, lr=1e-3), batch_size=batch_size, seed=seed,
                          name="text classifier (examples/text_classifier.py)")
