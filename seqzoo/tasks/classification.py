"""Text classification recipe: token embedder -> any registered encoder -> pooler -> MLP -> softmax.

Data: Fudan multi-task format (``LABEL<TAB>TEXT``), see :mod:`seqzoo.data.classification`.
Splits: a missing dev split is held out of train (``data.dev_fraction``); a missing test split
turns the run into k-fold cross-validation (``data.folds``), one sub-run per fold.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import Tensor, nn

from seqzoo.config import (
    ConfigError,
    ModelConfig,
    RunConfig,
    names_config_errors,
    require_name,
    require_ranges,
    with_recipe_arguments,
)
from seqzoo.data.chars import build_char_vocab
from seqzoo.data.classification import ClassificationData, LabeledText, LabelSet, bundled_corpus_dir
from seqzoo.data.embeddings import with_pretrained_words
from seqzoo.data.errors import DataError
from seqzoo.data.text import Tokenizer, Vocab
from seqzoo.embedders import CHAR_KEYS
from seqzoo.encoders.base import build_encoder
from seqzoo.heads.poolers import build_pooler
from seqzoo.tasks.common import (
    DEFAULT_MAX_LEN,
    Checkpoint,
    ClassifierTask,
    capped,
    pretrained_vectors,
    restore,
    token_embedder,
)
from seqzoo.training.devices import resolve_device
from seqzoo.training.registry import register_task

__all__ = [
    "ClassificationDataConfig",
    "ClassificationTask",
    "TextClassifier",
    "build_tasks",
    "load_data",
    "load_trained",
]


@dataclass
class ClassificationDataConfig:
    """Fudan-format classification data: ``{data_dir}/{name}.{train,dev,test}[.gz]``."""

    name: str = "movie_snippets"
    data_dir: str | None = None  # None = the corpus bundled with seqzoo
    lowercase: bool = True
    split_hyphens: bool = False  # well-acted -> well - acted (better pretrained-vector coverage)
    min_freq: int = 1
    max_vocab: int | None = None
    # Longer texts are cut to their first max_len tokens, in every split and in predict, with a warning that
    # counts them (None: no cap, and a batch as long as its longest text).
    max_len: int | None = DEFAULT_MAX_LEN
    max_train: int | None = None  # keep the first max_train training examples (a cap for a quick run)
    embeddings: str | None = None  # GloVe-format text vectors (.txt or .gz)
    embedding_dim: int = 50
    # With embeddings: the words of every split (the texts, never the labels) that have a vector join the
    # vocabulary, so that a word unseen in training keeps its pretrained vector instead of becoming <unk>.
    embedding_vocab: bool = False
    freeze_embeddings: bool = False
    folds: int = 5  # k-fold cross-validation when the task has no test split
    # Held out of train when the task has no dev split, drawn with train.seed (so each seed of a
    # multi-seed run holds out its own dev set; ABSA draws its with a fixed data.dev_seed).
    dev_fraction: float = 0.1

    def __post_init__(self) -> None:
        require_ranges(
            self,
            positive=("min_freq", "max_vocab", "max_len", "max_train", "embedding_dim", "dev_fraction"),
            rate=("dev_fraction",),
        )
        if self.folds < 2:
            raise ConfigError(f"folds: must be >= 2, got {self.folds!r}")
        require_name(self.name, "name")  # the files' stem in data_dir


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
        self.embedding = token_embedder(
            cfg, vocab_size, embedding_dim, vectors=vectors, freeze=freeze_embeddings, num_chars=num_chars
        )
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
    """The task's splits (dev held out of train when missing; ``test`` None when missing), the training
    split cut to its first ``cfg.max_train`` examples (after any dev split was held out of it)."""
    data_dir = Path(cfg.data_dir) if cfg.data_dir else bundled_corpus_dir()
    data = ClassificationData.from_dir(data_dir, cfg.name, dev_fraction=cfg.dev_fraction, seed=seed)
    data.train = data.train[: cfg.max_train]
    return data


class ClassificationTask(ClassifierTask):
    """The :class:`seqzoo.training.trainer.Task` for text classification (batching, evaluation and
    prediction: :class:`~seqzoo.tasks.common.ClassifierTask`)."""

    def __init__(
        self,
        config: RunConfig,
        splits: dict[str, list[LabeledText]],
        vocab: Vocab | None = None,
        labels: LabelSet | None = None,
        tokenizer: Tokenizer | None = None,
        embedding_dim: int | None = None,
        chars: Vocab | None = None,
    ) -> None:
        self.config = config
        data: ClassificationDataConfig = config.data
        self.tokenizer = tokenizer or Tokenizer(lowercase=data.lowercase, split_hyphens=data.split_hyphens)
        tokens = {
            name: capped([self.tokenizer(ex.text) for ex in split], data.max_len, name, _where(split))
            for name, split in splits.items()
        }
        self.vocab = vocab or self._build_vocab(tokens)
        self.labels = labels or LabelSet(ex.label for ex in splits["train"])
        self.label_names = list(self.labels)
        self.splits = {
            name: _Split(
                [self.vocab.encode(t) or [self.vocab.token_to_id(Vocab.UNK)] for t in tokens[name]],
                [self.labels.encode(ex.label, ex.path, ex.line) for ex in split],
            )
            for name, split in splits.items()
        }
        self.chars = None if config.model.char_encoder == "none" else chars or build_char_vocab(tokens["train"])
        self.encoded = {
            name: [(self._with_chars((ids,), t), y) for ids, y, t in zip(s.ids, s.labels, tokens[name], strict=True)]
            for name, s in self.splits.items()
        }
        dim, vectors = pretrained_vectors(data.embeddings, self.vocab, data.embedding_dim, embedding_dim)
        with names_config_errors("model"):
            self.model = TextClassifier(
                len(self.vocab), dim, len(self.labels), config.model, data.freeze_embeddings, vectors=vectors,
                num_chars=len(self.chars) if self.chars else 0,
            )  # fmt: skip
        self.device = resolve_device(config.train.device)
        self.model.to(self.device)

    def _build_vocab(self, tokens: dict[str, list[list[str]]]) -> Vocab:
        """The training words seen ``data.min_freq`` times (at most ``data.max_vocab``) and, with
        ``data.embeddings`` and ``data.embedding_vocab``, every split's words that have a pretrained vector."""
        data: ClassificationDataConfig = self.config.data
        vocab = Vocab.build(tokens["train"], min_freq=data.min_freq, max_size=data.max_vocab)
        if not (data.embeddings and data.embedding_vocab):
            return vocab
        return with_pretrained_words(
            vocab, (t for split in tokens.values() for text in split for t in text), data.embeddings
        )

    def _tokens(self, text: str) -> list[str]:
        tokens = self.tokenizer(text)
        limit = self.config.data.max_len
        return tokens[:limit] if limit else tokens

    def _encode_text(self, text: str, line: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
        tokens = self._tokens(text)
        return self._with_chars((self.vocab.encode(tokens) or [self.vocab.token_to_id(Vocab.UNK)],), tokens), {}

    def documents(self) -> dict[str, Any]:
        chars = {} if self.chars is None else {"chars.json": self.chars.to_dict()}
        return {
            "vocab.json": self.vocab.to_dict(),
            "labels.json": self.labels.to_dict(),
            "tokenizer.json": self.tokenizer.to_dict(),
            **chars,
        }


def _where(examples: list[LabeledText]) -> Callable[[int], str]:
    """Where example ``i`` of ``examples`` was read: its file and line."""
    return lambda i: f"{examples[i].path}:{examples[i].line}"


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


def _fold_tokens(task: ClassificationTask, fold: ClassificationData) -> dict[str, list[list[str]]]:
    return {name: [task._tokens(ex.text) for ex in split] for name, split in _splits(fold).items() if split is not None}


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
    splits: dict[str, list[LabeledText]] = {}
    fold: ClassificationData | None = None
    if with_data:
        data = load_data(config.data, config.train.seed)
        fold = _fold_of(data, config, best.parent)
        splits = {name: split for name, split in _splits(fold or data).items() if split is not None}

    def build(checkpoint: Checkpoint) -> ClassificationTask:
        labels = checkpoint.parsed("labels.json", LabelSet.from_dict)
        return ClassificationTask(config, splits, labels=labels, **checkpoint.text_inputs(config))

    task = restore(best, build)
    if fold is not None and task._build_vocab(_fold_tokens(task, fold)) != task.vocab:
        raise DataError(
            f"{best.parent.name} rebuilt from this data does not give the vocabulary its model was trained with "
            "(the data changed since training?): its held-out fold cannot be rebuilt",
            fold.sources["train"],
        )
    return task


def _inert_keys(config: RunConfig) -> dict[str, str]:
    data: ClassificationDataConfig = config.data
    return {} if data.embeddings else {"data.embedding_vocab": "it adds the words of data.embeddings"}


register_task(
    "classification",
    data_config=ClassificationDataConfig,
    model_keys={"encoder", "encoder_args", "pooler", "mlp_hidden", "embedding_dropout", "dropout", *CHAR_KEYS},
    build_tasks=build_tasks,
    load_trained=load_trained,
    inert_keys=_inert_keys,
)
