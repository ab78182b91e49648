"""Aspect-based sentiment model of the MZU paper (after Tang et al. 2016; MODELS.md 4.6).

Sentence ids -> embedding -> any registered encoder (the paper: a bidirectional MZU+DT or
DT-GRU, i.e. ``encoder_args={"bidirectional": True, ...}``) -> mean pooling over the real
outputs -> concatenated with the aspect embedding (mean of the aspect's word embeddings, from
the same embedding table) -> linear -> logits over :data:`~seqzoo.data.absa.POLARITIES`
(softmax in the loss).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from seqzoo.base import build_encoder
from seqzoo.data.absa import POLARITIES, AspectExample
from seqzoo.data.batching import pad_batch
from seqzoo.data.text import Tokenizer, Vocab
from seqzoo.poolers import build_pooler

__all__ = ["AspectBatch", "AspectSentimentClassifier", "make_batch"]


@dataclass
class AspectBatch:
    """Sentence ``ids`` / ``mask`` (B, T), aspect ``aspect_ids`` / ``aspect_mask`` (B, A), ``labels`` (B,)."""

    ids: Tensor
    mask: Tensor
    aspect_ids: Tensor
    aspect_mask: Tensor
    labels: Tensor


def make_batch(examples: Sequence[AspectExample], vocab: Vocab, tokenizer: Tokenizer) -> AspectBatch:
    """Tokenise and pad sentences and aspect terms; labels index :data:`POLARITIES`."""
    ids, mask = pad_batch([vocab.encode(tokenizer(e.text)) for e in examples], vocab.pad_id)
    aspect_ids, aspect_mask = pad_batch([vocab.encode(tokenizer(e.aspect)) for e in examples], vocab.pad_id)
    labels = torch.tensor([POLARITIES.index(e.polarity) for e in examples])
    return AspectBatch(ids, mask, aspect_ids, aspect_mask, labels)


class AspectSentimentClassifier(nn.Module):
    """(ids, mask, aspect_ids, aspect_mask) -> polarity logits (B, num_classes)."""

    def __init__(
        self,
        vocab_size: int,
        embedding_dim: int,
        encoder: str = "mzu",
        encoder_args: dict[str, Any] | None = None,
        num_classes: int = len(POLARITIES),
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, embedding_dim, padding_idx=0)
        self.encoder = build_encoder(encoder, embedding_dim, **(encoder_args or {}))
        self.sentence_pool = build_pooler("mean", self.encoder.output_size)
        self.aspect_pool = build_pooler("mean", embedding_dim)
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(self.encoder.output_size + embedding_dim, num_classes)

    def forward(self, ids: Tensor, mask: Tensor, aspect_ids: Tensor, aspect_mask: Tensor) -> Tensor:
        outputs, _ = self.encoder(self.dropout(self.embedding(ids)), mask)  # (B, T, H)
        sentence = self.sentence_pool(outputs, mask)  # (B, H)
        aspect = self.aspect_pool(self.embedding(aspect_ids), aspect_mask)  # (B, E)
        return self.classifier(self.dropout(torch.cat([sentence, aspect], dim=-1)))

    def auxiliary_loss(self) -> Tensor | None:
        return self.encoder.auxiliary_loss()
