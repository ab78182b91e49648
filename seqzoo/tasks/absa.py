"""Aspect-based sentiment recipe of the MZU paper (after Tang et al. 2016; MODELS.md 4.6).

Model: sentence ids -> token embedder (word vectors, plus character features with
``model.char_encoder``) -> any registered encoder (the paper: a bidirectional MZU+DT
or DT-GRU, i.e. ``encoder_args={"bidirectional": True, ...}``) -> pooling over the real outputs
(``model.pooler``, the paper's is mean) -> concatenated with the aspect embedding (mean of the
aspect's word embeddings, from the same embedding table) -> linear -> logits over
:data:`~seqzoo.data.absa.POLARITIES` (softmax in the loss).

Data (:class:`ABSADataConfig`): SemEval-2014 Task 4 XML files. SemEval ships
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from torch import Tensor, nn

from seqzoo.config import RunConfig, names_config_errors, require_ranges, with_recipe_arguments
from seqzoo.data.absa import POLARITIES, AspectExample, hard_subset, hold_out_sentences, read_semeval2014
from seqzoo.data.batching import pad_batch
from seqzoo.data.chars import build_char_vocab
from seqzoo.data.errors import DataError
from seqzoo.data.text import Tokenizer, Vocab
from seqzoo.embedders import CHAR_KEYS, TokenEmbedder
from seqzoo.encoders.base import build_encoder
from seqzoo.heads.poolers import build_pooler
from seqzoo.tasks.common import DEFAULT_MAX_LEN, ClassifierTask, capped, pretrained_vectors, restore, token_embedder
from seqzoo.training.devices import resolve_device
from seqzoo.training.registry import register_task

__all__ = [
    "ABSADataConfig",
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
class ABSADataConfig:
    """SemEval-2014 Task 4 aspect-term XML files (module docstring)."""

    train: str = ""
    test: str = ""
    dev: str | None = None  # None = dev_fraction of the train sentences held out (seed dev_seed)
    dev_fraction: float = 0.1
    dev_seed: int = 13  # fixed, so seeds of a multi-seed run share one dev set
    subset: Literal["ds", "hds"] = "ds"  # evaluation sets (dev and test): all, or the hard sentences
    lowercase: bool = True
    min_freq: int = 1
    embeddings: str | None = None  # GloVe-format text vectors (.txt or .gz)
    embedding_dim: int = 300
    freeze_embeddings: bool = False
    max_len: int | None = DEFAULT_MAX_LEN  # longer sentences are cut to their first max_len tokens (None: no cap)

    def __post_init__(self) -> None:
        require_ranges(self, positive=("dev_fraction", "min_freq", "embedding_dim", "max_len"), rate=("dev_fraction",))


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

    The sentence is embedded by ``embedding`` (a :class:`~seqzoo.embedders.TokenEmbedder`: word vectors, plus
    character features where it has them; by default a plain word table); the aspect is the mean of its
    words' vectors from the same word table.
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
        embedding: TokenEmbedder | None = None,
    ) -> None:
        super().__init__()
        self.embedding = embedding or TokenEmbedder(vocab_size, embedding_dim)
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


class ABSATask(ClassifierTask):
    """The :class:`seqzoo.training.trainer.Task` for aspect-term sentiment classification (batching,
    evaluation and prediction: :class:`~seqzoo.tasks.common.ClassifierTask`; the model reads the
    sentence and the aspect term).

    ``vocab``, ``tokenizer`` and ``embedding_dim`` are given when loading a trained model
    (``embedding_dim`` then skips the vector file: the checkpoint has the embeddings).
    """

    label_names = POLARITIES

    def __init__(
        self,
        config: RunConfig,
        splits: dict[str, list[AspectExample]],
        vocab: Vocab | None = None,
        tokenizer: Tokenizer | None = None,
        embedding_dim: int | None = None,
        chars: Vocab | None = None,
    ) -> None:
        self.config = config
        data: ABSADataConfig = config.data
        self.splits = splits
        self.tokenizer = tokenizer or Tokenizer(lowercase=data.lowercase)
        if vocab is None:
            vocab = Vocab.build([self.tokenizer(e.text) for e in splits["train"]], min_freq=data.min_freq)
        self.vocab = vocab
        model = config.model
        if model.char_encoder != "none":
            self.chars = chars or build_char_vocab(self.tokenizer(e.text) for e in splits["train"])
        # Encoded once: batches only pad (the data never changes between epochs).
        self.encoded = {name: self._encode(examples, name) for name, examples in splits.items()}
        dim, vectors = pretrained_vectors(data.embeddings, self.vocab, data.embedding_dim, embedding_dim)
        with names_config_errors("model"):
            self.model = AspectSentimentClassifier(
                len(self.vocab), dim, model.encoder, model.encoder_args, dropout=model.dropout,
                embedding_dropout=model.embedding_dropout, pooler=model.pooler,
                embedding=token_embedder(
                    model, len(self.vocab), dim, vectors=vectors, freeze=data.freeze_embeddings,
                    num_chars=len(self.chars) if self.chars else 0,
                ),
            )  # fmt: skip
        self.device = resolve_device(config.train.device)
        self.model.to(self.device)

    def evaluate(self, split: str) -> dict[str, float]:
        """``accuracy`` and mean cross-entropy ``loss`` over the examples of ``split``, and their number."""
        return {**super().evaluate(split), "examples": len(self.splits[split])}

    def _encode_text(self, text: str, line: int) -> tuple[tuple[list[int], ...], dict[str, Any]]:
        """``seqzoo predict`` reads ``sentence<TAB>aspect term`` (its record shows the aspect); a text
        without the tab raises a :class:`DataError` with its (1-based) position as ``line``."""
        sentence, _, aspect = text.partition("\t")
        if text.count("\t") != 1 or not (sentence.strip() and aspect.strip()):
            raise DataError(f"expected 'sentence<TAB>aspect term', got {text!r}", line=line)
        unk = [self.vocab.token_to_id(Vocab.UNK)]
        tokens = self.tokenizer(sentence)[: self.config.data.max_len]
        ids = (self.vocab.encode(tokens) or unk, self.vocab.encode(self.tokenizer(aspect.strip())) or unk)
        return self._with_chars(ids, tokens), {"aspect": aspect.strip()}

    def _encode(self, examples: list[AspectExample], split: str) -> list[tuple[tuple[Any, ...], int]]:
        """Each example's (sentence ids, aspect ids[, sentence char ids]) and polarity index; sentences
        longer than ``data.max_len`` tokens cut to that length (:func:`~seqzoo.tasks.common.capped`)."""
        sentences = capped(
            [self.tokenizer(e.text) for e in examples],
            self.config.data.max_len,
            split,
            lambda i: f"sentence {examples[i].sentence_id}",
        )
        return [
            (
                self._with_chars((self.vocab.encode(tokens), self.vocab.encode(self.tokenizer(e.aspect))), tokens),
                POLARITIES.index(e.polarity),
            )
            for tokens, e in zip(sentences, examples, strict=True)
        ]

    def documents(self) -> dict[str, Any]:
        chars = {} if self.chars is None else {"chars.json": self.chars.to_dict()}
        return {"vocab.json": self.vocab.to_dict(), "tokenizer.json": self.tokenizer.to_dict(), **chars}


def build_tasks(config: RunConfig) -> list[tuple[str, ABSATask]]:
    """One task on the files of ``config.data``."""
    return [("", ABSATask(config, load_splits(config.data)))]


def load_trained(config: RunConfig, best: Path, with_data: bool = True) -> ABSATask:
    """Rebuild a trained model from a ``best/`` checkpoint directory."""
    splits = load_splits(config.data) if with_data else {}

    return restore(best, lambda checkpoint: ABSATask(config, splits, **checkpoint.text_inputs(config)))


def _inert_keys(config: RunConfig) -> dict[str, str]:
    if config.data.dev is None:
        return {}
    return dict.fromkeys(("data.dev_fraction", "data.dev_seed"), "data.dev gives the dev set")


register_task(
    "absa",
    data_config=ABSADataConfig,
    model_keys={"encoder", "encoder_args", "pooler", "embedding_dropout", "dropout", *CHAR_KEYS},
    build_tasks=build_tasks,
    load_trained=load_trained,
    inert_keys=_inert_keys,
)
