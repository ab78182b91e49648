"""Aspect-based sentiment recipe of the MZU paper (after Tang et al. 2016; MODELS.md 4.6).

Model: sentence ids -> token embedder (word vectors, plus character features with
``model.char_encoder``) -> any registered encoder (the paper: a bidirectional MZU+DT
or DT-GRU, i.e. ``encoder_args={"bidirectional": True, ...}``) -> pooling over the real outputs
(``model.pooler``, the paper's is mean) -> concatenated with the aspect embedding (mean of the
aspect's word embeddings, from the same embedding table) -> linear -> logits over
:data:`~seqzoo.data.absa.POLARITIES` (softmax in the loss).

Data (:class:`~seqzoo.config.ABSADataConfig`): SemEval-2014 Task 4 XML files. SemEval ships
train and test only, so without ``data.dev`` the dev set is ``data.dev_fraction`` of the train
*sentences* held out with the fixed ``data.dev_seed`` (all seeds of a run share it).
``data.subset`` chooses the evaluation sets, as in the paper (after Xue & Li 2018): ``ds`` is
every aspect term; ``hds`` keeps the sentences whose aspects carry at least two different
polarities, each copied once per aspect (:func:`~seqzoo.data.absa.hard_subset`). The subset
applies to dev (model selection) and test; the model always trains on the full train set
(DS), so a DS run and an HDS run differ only in what they select and report on.

Metric: ``accuracy`` over the evaluation examples (one per aspect term), all four polarities
(``conflict`` included) as the paper does; the runner reports mean ± std over ``train.seeds``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqzoo.config import ABSADataConfig, RunConfig, names_config_errors, with_recipe_arguments
from seqzoo.data.absa import POLARITIES, AspectExample, hard_subset, hold_out_sentences, read_semeval2014
from seqzoo.data.batching import bucket_batches, pad_batch
from seqzoo.data.errors import DataError
from seqzoo.data.text import Tokenizer, Vocab
from seqzoo.embedders import TokenEmbedder
from seqzoo.encoders.base import build_encoder, module_mode
from seqzoo.heads.poolers import build_pooler
from seqzoo.tasks.common import accuracy_and_loss, class_probabilities, epoch_seed, pretrained_vectors
from seqzoo.training.devices import resolve_device
from seqzoo.training.task import StepLoss

__all__ = [
    "ABSATask",
    "AspectBatch",
    "AspectSentimentClassifier",
    "build_tasks",
    "collate",
    "encode_examples",
    "load_splits",
    "load_trained",
    "make_batch",
]


@dataclass
class AspectBatch:
    """Sentence ``ids`` / ``mask`` (B, T), aspect ``aspect_ids`` / ``aspect_mask`` (B, A), ``labels`` (B,)."""

    ids: Tensor
    mask: Tensor
    aspect_ids: Tensor
    aspect_mask: Tensor
    labels: Tensor


#: One example as ids: (sentence ids, aspect ids, polarity index).
EncodedAspect = tuple[list[int], list[int], int]


def encode_examples(examples: Sequence[AspectExample], vocab: Vocab, tokenizer: Tokenizer) -> list[EncodedAspect]:
    """Tokenise sentences and aspect terms into ids; labels index :data:`POLARITIES`."""
    return [
        (vocab.encode(tokenizer(e.text)), vocab.encode(tokenizer(e.aspect)), POLARITIES.index(e.polarity))
        for e in examples
    ]


def collate(encoded: Sequence[EncodedAspect], pad_id: int = 0) -> AspectBatch:
    """Pad encoded examples into an :class:`AspectBatch`."""
    ids, mask = pad_batch([e[0] for e in encoded], pad_id)
    aspect_ids, aspect_mask = pad_batch([e[1] for e in encoded], pad_id)
    return AspectBatch(ids, mask, aspect_ids, aspect_mask, torch.tensor([e[2] for e in encoded]))


def make_batch(examples: Sequence[AspectExample], vocab: Vocab, tokenizer: Tokenizer) -> AspectBatch:
    """Tokenise and pad sentences and aspect terms; labels index :data:`POLARITIES`."""
    return collate(encode_examples(examples, vocab, tokenizer), vocab.pad_id)


class AspectSentimentClassifier(nn.Module):
    """(ids, mask, aspect_ids, aspect_mask[, sentence char ids (B, T, C)]) -> polarity logits (B, num_classes).

    The sentence is embedded by a :class:`~seqzoo.embedders.TokenEmbedder` (word vectors, initially
    ``vectors``, plus the ``char_encoder``'s features where it has one); the aspect is the mean of
    its words' vectors from the same word table.
    """

    def __init__(
        self,
        vocab_size: int,
        embedding_dim: int,
        encoder: str = "mzu",
        encoder_args: dict[str, Any] | None = None,
        num_classes: int = len(POLARITIES),
        dropout: float = 0.0,
        embedding_dropout: float = 0.0,
        pooler: str = "mean",
        *,
        vectors: Tensor | None = None,
        freeze_embeddings: bool = False,
        char_encoder: Literal["none", "cnn", "lstm"] = "none",
        num_chars: int = 0,
        char_embedding_dim: int = 25,
        char_hidden_size: int = 50,
        char_kernel_size: int = 3,
    ) -> None:
        super().__init__()
        self.embedding = TokenEmbedder(
            vocab_size, embedding_dim, vectors=vectors, freeze=freeze_embeddings, char_encoder=char_encoder,
            num_chars=num_chars, char_embedding_dim=char_embedding_dim, char_hidden_size=char_hidden_size,
            char_kernel_size=char_kernel_size,
        )  # fmt: skip
        self.embedding_dropout = nn.Dropout(embedding_dropout)
        size = self.embedding.output_size
        self.encoder = build_encoder(encoder, **with_recipe_arguments(encoder_args or {}, input_size=size))
        out = self.encoder
        self.sentence_pool = build_pooler(pooler, out.output_size, out.bidirectional, out.global_size)
        self.aspect_pool = build_pooler("mean", embedding_dim)
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(self.sentence_pool.output_size + embedding_dim, num_classes)

    def forward(
        self, ids: Tensor, mask: Tensor, aspect_ids: Tensor, aspect_mask: Tensor, chars: Tensor | None = None
    ) -> Tensor:
        outputs, state = self.encoder(self.embedding_dropout(self.embedding(ids, chars)), mask)  # (B, T, H)
        sentence = self.sentence_pool(outputs, mask, self.encoder.global_state(state))  # (B, P)
        aspect = self.aspect_pool(self.embedding.words(aspect_ids), aspect_mask)  # (B, E)
        return self.classifier(self.dropout(torch.cat([sentence, aspect], dim=-1)))

    def auxiliary_loss(self) -> Tensor | None:
        return self.encoder.auxiliary_loss()


def load_splits(cfg: ABSADataConfig) -> dict[str, list[AspectExample]]:
    """train (always DS) and dev / test (DS or HDS per ``cfg.subset``); see the module docstring."""
    for key in ("train", "test"):
        if not getattr(cfg, key):
            raise DataError(f"data.{key} is not set: the ABSA recipe needs SemEval-2014 train and test XML files")
    train = read_semeval2014(cfg.train)
    if cfg.dev:
        dev = read_semeval2014(cfg.dev)
    else:
        try:
            train, dev = hold_out_sentences(train, cfg.dev_fraction, cfg.dev_seed)
        except ValueError as err:  # too few sentences to hold out a dev set
            raise DataError(f"{err} (no data.dev file given)", cfg.train) from None
    splits = {"train": train, "dev": dev, "test": read_semeval2014(cfg.test)}
    if cfg.subset == "hds":
        splits["dev"], splits["test"] = hard_subset(splits["dev"]), hard_subset(splits["test"])
    for name, examples in splits.items():
        if not examples:
            raise DataError(f"the {name} split has no {cfg.subset.upper()} examples", getattr(cfg, name) or cfg.train)
    return splits


class ABSATask:
    """The :class:`seqzoo.training.trainer.Task` for aspect-term sentiment classification.

    ``vocab``, ``tokenizer`` and ``embedding_dim`` are given when loading a trained model
    (``embedding_dim`` then skips the vector file: the checkpoint has the embeddings).
    """

    metric = "accuracy"
    higher_is_better = True

    def __init__(
        self,
        config: RunConfig,
        splits: dict[str, list[AspectExample]],
        vocab: Vocab | None = None,
        tokenizer: Tokenizer | None = None,
        embedding_dim: int | None = None,
    ) -> None:
        self.config = config
        data: ABSADataConfig = config.data
        self.splits = splits
        self.tokenizer = tokenizer or Tokenizer(lowercase=data.lowercase)
        if vocab is None:
            vocab = Vocab.build([self.tokenizer(e.text) for e in splits["train"]], min_freq=data.min_freq)
        self.vocab = vocab
        # Encoded once: batches only pad (the data never changes between epochs).
        self.encoded = {name: encode_examples(examples, vocab, self.tokenizer) for name, examples in splits.items()}
        dim, vectors = pretrained_vectors(data.embeddings, self.vocab, data.embedding_dim, embedding_dim)
        model = config.model
        with names_config_errors("model"):
            self.model = AspectSentimentClassifier(
                len(self.vocab), dim, model.encoder, model.encoder_args, dropout=model.dropout,
                embedding_dropout=model.embedding_dropout, pooler=model.pooler,
            )  # fmt: skip
        if vectors is not None:
            with torch.no_grad():
                self.model.embedding.weight.copy_(vectors)
        self.model.embedding.weight.requires_grad_(not data.freeze_embeddings)
        self.device = resolve_device(config.train.device)
        self.model.to(self.device)

    def _batch(self, split: str, indices: list[int]) -> AspectBatch:
        encoded = self.encoded[split]
        batch = collate([encoded[i] for i in indices], self.vocab.pad_id)
        return AspectBatch(**{f.name: getattr(batch, f.name).to(self.device) for f in fields(batch)})

    def _logits(self, batch: AspectBatch) -> Tensor:
        return self.model(batch.ids, batch.mask, batch.aspect_ids, batch.aspect_mask)

    def _lengths(self, split: str) -> list[int]:
        """Sentence lengths in tokens, for length bucketing."""
        return [len(e[0]) for e in self.encoded[split]]

    def train_batches(self, epoch: int) -> list[list[int]]:
        seed = epoch_seed(self.config.train.seed, epoch)
        return bucket_batches(self._lengths("train"), self.config.train.batch_size, shuffle=True, seed=seed)

    def train_loss(self, batch: list[int]) -> StepLoss:
        data = self._batch("train", batch)
        loss = F.cross_entropy(self._logits(data), data.labels)
        return StepLoss.plus(loss, self.model.auxiliary_loss(), int(data.mask.sum()), len(batch))

    def evaluate(self, split: str) -> dict[str, float]:
        """``accuracy`` and mean cross-entropy ``loss`` over the examples of ``split``, and their number."""
        size = self.config.train.eval_batch_size
        batches = (self._batch(split, idx) for idx in bucket_batches(self._lengths(split), size, shuffle=False))
        metrics = accuracy_and_loss(self.model, ((self._logits(b), b.labels) for b in batches))
        return {**metrics, "examples": len(self.splits[split])}

    @torch.no_grad()
    def predict(self, texts: list[str]) -> list[dict[str, Any]]:
        """``seqzoo predict``: each text is ``sentence<TAB>aspect term``; gives the aspect, its most
        probable polarity and each polarity's probability. A text without the tab raises a
        :class:`DataError` with its (1-based) position as ``line``."""
        pairs = []
        for line, text in enumerate(texts, 1):
            sentence, _, aspect = text.partition("\t")
            if text.count("\t") != 1 or not (sentence.strip() and aspect.strip()):
                raise DataError(f"expected 'sentence<TAB>aspect term', got {text!r}", line=line)
            pairs.append((sentence, aspect.strip()))
        unk = [self.vocab.token_to_id(Vocab.UNK)]
        results: list[dict[str, Any]] = []
        size = self.config.train.eval_batch_size
        with module_mode(self.model, training=False):
            for start in range(0, len(pairs), size):
                chunk = pairs[start : start + size]
                ids, mask = pad_batch([self.vocab.encode(self.tokenizer(s)) or unk for s, _ in chunk])
                aspect_ids, aspect_mask = pad_batch([self.vocab.encode(self.tokenizer(a)) or unk for _, a in chunk])
                tensors = (t.to(self.device) for t in (ids, mask, aspect_ids, aspect_mask))
                rows = class_probabilities(self.model(*tensors), POLARITIES)
                results.extend({"aspect": aspect, **row} for (_, aspect), row in zip(chunk, rows, strict=True))
        return results

    def documents(self) -> dict[str, Any]:
        return {"vocab.json": self.vocab.to_dict(), "tokenizer.json": self.tokenizer.to_dict()}


def build_tasks(config: RunConfig) -> list[tuple[str, ABSATask]]:
    """One task on the files of ``config.data``."""
    return [("", ABSATask(config, load_splits(config.data)))]


def load_trained(config: RunConfig, best: Path, with_data: bool = True) -> ABSATask:
    """Rebuild a trained model from a ``best/`` checkpoint directory."""
    from seqzoo.data.io import read_json
    from seqzoo.training.checkpoint import load_tensors, load_weights

    tensors = load_tensors(best / "model.safetensors")
    task = ABSATask(
        config,
        load_splits(config.data) if with_data else {},
        vocab=Vocab.from_dict(read_json(best / "vocab.json")),
        tokenizer=Tokenizer.from_dict(read_json(best / "tokenizer.json")),
        embedding_dim=tensors["embedding.weight"].shape[1],
    )
    load_weights(task.model, best / "model.safetensors", tensors)
    return task
