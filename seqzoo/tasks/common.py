"""Pieces the classification-style recipes share (text classification, aspect sentiment)."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqzoo.data.embeddings import load_vectors
from seqzoo.data.text import Vocab
from seqzoo.encoders.base import module_mode

__all__ = ["accuracy_and_loss", "epoch_seed", "pretrained_vectors"]

log = logging.getLogger("seqzoo")


def epoch_seed(seed: int, epoch: int) -> int:
    """Seed of an epoch's batch order: a pure function of (run seed, epoch), so resumes replay it."""
    return seed * 1_000_003 + epoch


def pretrained_vectors(
    path: str | None, vocab: Vocab, default_dim: int, checkpoint_dim: int | None = None
) -> tuple[int, Tensor | None]:
    """Embedding size and initial vectors for ``vocab``.

    Reloading a trained model (``checkpoint_dim`` given) reads no vector file: the checkpoint
    holds the embeddings and fixes their size. Otherwise the size is that of the vectors at
    ``path`` (GloVe/word2vec text) or ``default_dim`` without a file.
    """
    if checkpoint_dim is not None:
        return checkpoint_dim, None
    if not path:
        return default_dim, None
    vectors, stats = load_vectors(path, vocab)
    log.info("embeddings %s: %s", path, stats)
    return vectors.shape[1], vectors


@torch.no_grad()
def accuracy_and_loss(model: nn.Module, logits_and_labels: Iterable[tuple[Tensor, Tensor]]) -> dict[str, float]:
    """Accuracy and mean cross-entropy over lazily computed ``(logits (B, C), labels (B,))`` batches.

    ``model`` is in eval mode while the batches are computed and gets its mode back afterwards.
    """
    correct, loss_sum, n = 0, 0.0, 0
    with module_mode(model, training=False):
        for logits, labels in logits_and_labels:
            loss_sum += F.cross_entropy(logits, labels, reduction="sum").item()
            correct += int((logits.argmax(-1) == labels).sum())
            n += len(labels)
    return {"accuracy": correct / max(n, 1), "loss": loss_sum / max(n, 1)}


def class_probabilities(logits: Tensor, names: Sequence[str]) -> list[dict[str, Any]]:
    """``seqzoo predict`` rows from logits (B, C): the most probable class and each class's probability."""
    rows = []
    for row in torch.softmax(logits, dim=-1).tolist():
        best = max(range(len(row)), key=row.__getitem__)
        rows.append({"label": names[best], "probabilities": dict(zip(names, row, strict=True))})
    return rows
