"""Text classification recipe: token embedder -> any registered encoder -> pooler -> MLP -> softmax.

Data: Fudan multi-task format (``LABEL<TAB>TEXT``), see :mod:`seqzoo.data.classification`.
Splits: a missing dev split is held out of train (``data.dev_fraction``); a missing test split
turns the run into k-fold cross-validation (``data.folds``), one sub-run per fold.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqzoo.config import ClassificationDataConfig, ModelConfig, RunConfig, names_config_errors, with_recipe_arguments
from seqzoo.data.batching import bucket_batches, pad_batch
from seqzoo.data.classification import ClassificationData, LabeledText, LabelSet, bundled_corpus_dir
from seqzoo.data.errors import DataError
from seqzoo.data.text import Tokenizer, Vocab
from seqzoo.embedders import TokenEmbedder
from seqzoo.encoders.base import build_encoder, module_mode
from seqzoo.heads.poolers import build_pooler
from seqzoo.tasks.common import accuracy_and_loss, class_probabilities, epoch_seed, pretrained_vectors
from seqzoo.training.devices import resolve_device
from seqzoo.training.task import StepLoss

__all__ = ["ClassificationTask", "TextClassifier", "build_tasks", "load_data", "load_trained"]


class TextClassifier(nn.Module):
    """Token embedder (B, T) [+ char ids (B, T, C)] -> encoder (B, T, H) -> pooler (B, P) -> MLP -> logits (B, C).

    ``vectors``: the word table's initial values; ``num_chars``: the char vocabulary's size, when
    ``cfg.char_encoder`` adds character features (see :class:`~seqzoo.embedders.TokenEmbedder`).
    """

    def __init__(
        self,
        vocab_size: int,
        embedding_dim: int,
        num_classes: int,
        cfg: ModelConfig,
        freeze_embeddings: bool = False,
        *,
        vectors: Tensor | None = None,
        num_chars: int = 0,
    ) -> None:
        super().__init__()
        self.embedding = TokenEmbedder(
            vocab_size, embedding_dim, vectors=vectors, freeze=freeze_embeddings, char_encoder=cfg.char_encoder,
            num_chars=num_chars, char_embedding_dim=cfg.char_embedding_dim, char_hidden_size=cfg.char_hidden_size,
            char_kernel_size=cfg.char_kernel_size,
        )  # fmt: skip
        self.embedding_dropout = nn.Dropout(cfg.embedding_dropout)
        size = self.embedding.output_size
        self.encoder = build_encoder(cfg.encoder, **with_recipe_arguments(cfg.encoder_args, input_size=size))
        encoder = self.encoder
        self.pooler = build_pooler(cfg.pooler, encoder.output_size, encoder.bidirectional, encoder.global_size)
        layers: list[nn.Module] = []
        width = self.pooler.output_size
        for hidden in cfg.mlp_hidden:
            layers += [nn.Dropout(cfg.dropout), nn.Linear(width, hidden), nn.ReLU()]
            width = hidden
        layers += [nn.Dropout(cfg.dropout), nn.Linear(width, num_classes)]
        self.head = nn.Sequential(*layers)

    def forward(self, ids: Tensor, mask: Tensor, chars: Tensor | None = None) -> Tensor:
        x = self.embedding_dropout(self.embedding(ids, chars))  # (B, T, E)
        outputs, state = self.encoder(x, mask)  # (B, T, H)
        return self.head(self.pooler(outputs, mask, self.encoder.global_state(state)))  # (B, C)

    def auxiliary_loss(self) -> Tensor | None:
        return self.encoder.auxiliary_loss()


@dataclass
class _Split:
    ids: list[list[int]]
    labels: list[int]


def load_data(cfg: ClassificationDataConfig, seed: int) -> ClassificationData:
    """The task's splits (dev held out of train when missing; ``test`` None when missing)."""
    data_dir = Path(cfg.data_dir) if cfg.data_dir else bundled_corpus_dir()
    return ClassificationData.from_dir(data_dir, cfg.name, dev_fraction=cfg.dev_fraction, seed=seed)


class ClassificationTask:
    """The :class:`seqzoo.training.trainer.Task` for text classification."""

    metric = "accuracy"
    higher_is_better = True

    def __init__(
        self,
        config: RunConfig,
        splits: dict[str, list[LabeledText]],
        vocab: Vocab | None = None,
        labels: LabelSet | None = None,
        tokenizer: Tokenizer | None = None,
        embedding_dim: int | None = None,
    ) -> None:
        self.config = config
        data: ClassificationDataConfig = config.data
        self.tokenizer = tokenizer or Tokenizer(lowercase=data.lowercase, split_hyphens=data.split_hyphens)
        tokens = {name: [self._tokens(ex.text) for ex in split] for name, split in splits.items()}
        self.vocab = vocab or self._build_vocab(tokens["train"])
        self.labels = labels or LabelSet(ex.label for ex in splits["train"])
        self.splits = {
            name: _Split(
                [self.vocab.encode(t) or [self.vocab.token_to_id(Vocab.UNK)] for t in tokens[name]],
                [self.labels.encode(ex.label, ex.path, ex.line) for ex in split],
            )
            for name, split in splits.items()
        }
        dim, vectors = pretrained_vectors(data.embeddings, self.vocab, data.embedding_dim, embedding_dim)
        with names_config_errors("model"):
            self.model = TextClassifier(len(self.vocab), dim, len(self.labels), config.model, data.freeze_embeddings)
        if vectors is not None:
            with torch.no_grad():
                self.model.embedding.weight.copy_(vectors)
        self.device = resolve_device(config.train.device)
        self.model.to(self.device)

    def _build_vocab(self, train_tokens: list[list[str]]) -> Vocab:
        data: ClassificationDataConfig = self.config.data
        return Vocab.build(train_tokens, min_freq=data.min_freq, max_size=data.max_vocab)

    def _tokens(self, text: str) -> list[str]:
        tokens = self.tokenizer(text)
        limit = self.config.data.max_len
        return tokens[:limit] if limit else tokens

    def _batch(self, split: _Split, indices: list[int]) -> tuple[Tensor, Tensor, Tensor]:
        ids, mask = pad_batch([split.ids[i] for i in indices])
        labels = torch.tensor([split.labels[i] for i in indices])
        return ids.to(self.device), mask.to(self.device), labels.to(self.device)

    def train_batches(self, epoch: int) -> list[list[int]]:
        lengths = [len(s) for s in self.splits["train"].ids]
        seed = epoch_seed(self.config.train.seed, epoch)
        return bucket_batches(lengths, self.config.train.batch_size, shuffle=True, seed=seed)

    def train_loss(self, batch: list[int]) -> StepLoss:
        ids, mask, y = self._batch(self.splits["train"], batch)
        loss = F.cross_entropy(self.model(ids, mask), y)
        return StepLoss.plus(loss, self.model.auxiliary_loss(), int(mask.sum()), len(batch))

    def evaluate(self, split: str) -> dict[str, float]:
        data = self.splits[split]
        size = self.config.train.eval_batch_size
        batches = (self._batch(data, idx) for idx in bucket_batches([len(s) for s in data.ids], size, shuffle=False))
        return accuracy_and_loss(self.model, ((self.model(ids, mask), y) for ids, mask, y in batches))

    @torch.no_grad()
    def predict(self, texts: list[str]) -> list[dict[str, Any]]:
        """Label and class probabilities for raw texts."""
        ids = [self.vocab.encode(self._tokens(t)) or [self.vocab.token_to_id(Vocab.UNK)] for t in texts]
        results: list[dict[str, Any]] = []
        size = self.config.train.eval_batch_size
        with module_mode(self.model, training=False):
            for start in range(0, len(ids), size):
                batch, mask = pad_batch(ids[start : start + size])
                logits = self.model(batch.to(self.device), mask.to(self.device))
                results.extend(class_probabilities(logits, list(self.labels)))
        return results

    def documents(self) -> dict[str, Any]:
        return {
            "vocab.json": self.vocab.to_dict(),
            "labels.json": self.labels.to_dict(),
            "tokenizer.json": self.tokenizer.to_dict(),
        }


def build_tasks(config: RunConfig) -> list[tuple[str, ClassificationTask]]:
    """One task per fold: ``[("", task)]`` with a test split, else ``[("fold-1", ...), ...]`` (:func:`_fold_name`)."""
    data = load_data(config.data, config.train.seed)
    if data.test is not None:
        return [("", ClassificationTask(config, _splits(data), labels=data.labels))]
    return [
        (_fold_name(f), ClassificationTask(config, _splits(fold), labels=data.labels))
        for f, fold in enumerate(data.folds(config.data.folds, seed=config.train.seed))
    ]


def _fold_name(index: int) -> str:
    """The sub-run directory of fold ``index`` (0-based) of a cross-validated run."""
    return f"fold-{index + 1}"


def _splits(data: ClassificationData) -> dict[str, list[LabeledText]]:
    return {"train": data.train, "dev": data.dev, "test": data.test}


def _fold_of(data: ClassificationData, config: RunConfig, sub_run: Path) -> ClassificationData | None:
    """The fold that ``sub_run`` (``fold-N``) of a cross-validated run was trained and tested on
    (test: its held-out fold, train: the other folds, dev as in training); None with a test split."""
    if data.test is not None:
        return None
    names = [_fold_name(f) for f in range(config.data.folds)]
    if sub_run.name not in names:
        raise DataError(
            f"the data has no test split, so the run was cross-validated in {len(names)} folds, but this is not "
            f"one of its fold directories ({names[0]} .. {names[-1]}): its held-out fold cannot be rebuilt",
            sub_run,
        )
    return data.folds(config.data.folds, seed=config.train.seed)[names.index(sub_run.name)]


def load_trained(config: RunConfig, best: Path, with_data: bool = True) -> ClassificationTask:
    """Rebuild a trained classifier from a ``best/`` checkpoint directory.

    A fold of a cross-validated run gets that fold's splits back (see :func:`_fold_of`); if the
    fold's training split no longer gives the vocabulary the model was trained with (the data
    changed), its held-out fold cannot be trusted and a :class:`DataError` says so.
    """
    from seqzoo.data.io import read_json
    from seqzoo.training.checkpoint import load_tensors, load_weights

    splits: dict[str, list[LabeledText]] = {}
    fold: ClassificationData | None = None
    if with_data:
        data = load_data(config.data, config.train.seed)
        fold = _fold_of(data, config, best.parent)
        splits = {name: split for name, split in _splits(fold or data).items() if split is not None}
    weights = load_tensors(best / "model.safetensors")
    task = ClassificationTask(
        config,
        splits,
        vocab=Vocab.from_dict(read_json(best / "vocab.json")),
        labels=LabelSet.from_dict(read_json(best / "labels.json")),
        tokenizer=Tokenizer.from_dict(read_json(best / "tokenizer.json")),
        embedding_dim=weights["embedding.weight"].shape[1],  # the vectors' size, not data.embedding_dim
    )
    if fold is not None and task._build_vocab([task._tokens(ex.text) for ex in fold.train]) != task.vocab:
        raise DataError(
            f"{best.parent.name} rebuilt from this data does not give the vocabulary its model was trained with "
            "(the data changed since training?): its held-out fold cannot be rebuilt",
            fold.sources["train"],
        )
    load_weights(task.model, best / "model.safetensors", weights)
    return task
