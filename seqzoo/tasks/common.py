"""Pieces the recipes share: reloading a ``best/`` checkpoint (:func:`restore`), and the batching,
evaluation and prediction of the classification-style recipes (:class:`ClassifierTask`: text
classification, aspect sentiment)."""

from __future__ import annotations

import abc
import logging
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from seqzoo.config import ModelConfig, RunConfig
from seqzoo.data.batching import bucket_batches, pad_batch
from seqzoo.data.chars import encode_chars, pad_chars
from seqzoo.data.embeddings import load_vectors
from seqzoo.data.errors import DataError
from seqzoo.data.io import read_json
from seqzoo.data.text import Tokenizer, Vocab
from seqzoo.embedders import TokenEmbedder
from seqzoo.encoders.base import module_mode
from seqzoo.training.checkpoint import load_tensors, load_weights
from seqzoo.training.task import StepLoss

__all__ = [
    "DEFAULT_MAX_LEN",
    "Checkpoint",
    "ClassifierTask",
    "Encoded",
    "accuracy_and_loss",
    "capped",
    "class_probabilities",
    "epoch_seed",
    "pretrained_vectors",
    "restore",
    "token_embedder",
]

T = TypeVar("T")

log = logging.getLogger("seqzoo")


def epoch_seed(seed: int, epoch: int) -> int:
    """Seed of an epoch's batch order: a pure function of (run seed, epoch), so resumes replay it."""
    return seed * 1_000_003 + epoch


#: The default ``data.max_len`` of the classification-style recipes: a text of more tokens is cut to its
#: first ones (with a warning), so that one long line cannot make a batch of that length.
DEFAULT_MAX_LEN = 1000


def capped(token_lists: list[list[str]], limit: int | None, split: str, where: Callable[[int], str]) -> list[list[str]]:
    """``token_lists`` cut to their first ``limit`` tokens (None: no cap), with one warning for ``split``
    that counts the texts cut and names the longest (``where(i)``: e.g. the file and line of text ``i``)."""
    if limit is None:
        return token_lists
    cut = [i for i, tokens in enumerate(token_lists) if len(tokens) > limit]
    if cut:
        longest = max(cut, key=lambda i: len(token_lists[i]))
        log.warning(
            "%s: %d text%s longer than data.max_len=%d tokens cut to that length (the longest: %d tokens, %s)",
            split, len(cut), "s" if len(cut) > 1 else "", limit, len(token_lists[longest]), where(longest),
        )  # fmt: skip
    return [tokens[:limit] for tokens in token_lists]


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


def token_embedder(
    cfg: ModelConfig, vocab_size: int, embedding_dim: int, *, vectors: Tensor | None = None, freeze: bool = False,
    num_chars: int = 0,
) -> TokenEmbedder:  # fmt: skip
    """The recipes' :class:`~seqzoo.embedders.TokenEmbedder`: a word table (initially ``vectors``, frozen when
    ``freeze``) plus the character features the ``model`` config names (``num_chars``: the char vocabulary's size)."""
    return TokenEmbedder(
        vocab_size, embedding_dim, vectors=vectors, freeze=freeze, char_encoder=cfg.char_encoder, num_chars=num_chars,
        char_embedding_dim=cfg.char_embedding_dim, char_hidden_size=cfg.char_hidden_size,
        char_kernel_size=cfg.char_kernel_size,
    )  # fmt: skip


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


class Checkpoint:
    """A ``best/`` checkpoint directory as a recipe reloads it: its JSON documents and its weights."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.weights = load_tensors(path / "model.safetensors")

    def document(self, name: str) -> Any:
        """The JSON document ``name`` the task saved beside the model (``vocab.json``, ``labels.json``, ...)."""
        return read_json(self.path / name)

    def parsed(self, name: str, parse: Callable[[Any], T]) -> T:
        """The JSON object ``name`` read by ``parse`` (e.g. ``Vocab.from_dict``); one that is no object, or
        that ``parse`` refuses, is a :class:`DataError` naming the file. The message does not quote the
        file's content (through a link it may be another file's)."""
        document = self.document(name)
        try:
            if not isinstance(document, dict):
                raise ValueError(f"expected a JSON object, got a {type(document).__name__}")
            return parse(document)
        except ValueError as err:
            reason = str(err).partition(":")[0].partition(", got")[0]  # what is wrong, not what was found
            raise DataError(f"not a valid {name}: {reason}", self.path / name) from None

    def tensor(self, name: str) -> Tensor:
        """The stored weight ``name``; a :class:`DataError` naming the file where it has none."""
        if name not in self.weights:
            path = self.path / "model.safetensors"
            raise DataError(f"holds no {name!r} tensor: not a checkpoint of this model", path)
        return self.weights[name]

    def vocab(self, name: str = "vocab.json") -> Vocab:
        return self.parsed(name, Vocab.from_dict)

    def text_inputs(self, config: RunConfig) -> dict[str, Any]:
        """How a classifier task read its texts, as its keyword arguments: ``vocab``, ``tokenizer``,
        ``embedding_dim`` (the stored vectors' size, not ``data.embedding_dim``) and ``chars`` (the
        character vocabulary where the model reads character features, else None)."""
        chars = None if config.model.char_encoder == "none" else self.vocab("chars.json")
        return {
            "vocab": self.vocab(),
            "tokenizer": self.parsed("tokenizer.json", Tokenizer.from_dict),
            "embedding_dim": self.tensor("embedding.weight").shape[1],
            "chars": chars,
        }


class _StayOnMeta(TorchFunctionMode):
    """Inside ``torch.device("meta")``: a meta tensor moved to a device stays on meta (a task's
    ``model.to(device)``), so that a model is built without memory to read its shapes."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func is Tensor.to and isinstance(args[0], Tensor) and args[0].is_meta:
            return args[0]
        return func(*args, **(kwargs or {}))


def _refuse_misfit(best: Path, model: nn.Module, weights: dict[str, Tensor]) -> None:
    """A :class:`DataError` naming ``best/config.json`` where the model it describes (built on the meta
    device: no memory) has other tensor names or shapes than the checkpoint's weights."""
    shapes = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    stored = {name: tuple(t.shape) for name, t in weights.items()}
    if shapes == stored:
        return
    names = sorted(shapes.keys() ^ stored.keys())
    misfits = [
        f"{n}: {shapes[n]} in the config, {stored[n]} stored"
        for n in sorted(shapes)
        if stored.get(n, shapes[n]) != shapes[n]
    ]
    problems = misfits + [f"{n} {'missing from' if n in shapes else 'not in'} model.safetensors" for n in names]
    raise DataError(
        f"describes a model whose weights do not fit model.safetensors ({'; '.join(problems[:3])}): "
        "was the config edited?",
        best / "config.json",
    )


def restore(best: Path, build: Callable[[Checkpoint], T]) -> T:
    """The one way a recipe's ``load_trained`` rebuilds a trained task: ``build`` makes the task from the
    checkpoint's documents (all a recipe supplies: which documents, and how its task is made of
    them), then the checkpoint's weights are loaded into its ``model``. The model is first built on
    the meta device and its shapes compared with the stored weights', so that a config edited to
    describe a much larger model is refused before anything of its size is allocated."""
    checkpoint = Checkpoint(best)
    quiet = log.disabled
    log.disabled = True  # what building the task logs (e.g. texts cut to data.max_len) is said once, below
    try:
        with torch.device("meta"), _StayOnMeta():
            blueprint = build(checkpoint)
    finally:
        log.disabled = quiet
    _refuse_misfit(best, blueprint.model, checkpoint.weights)  # type: ignore[attr-defined]
    task = build(checkpoint)
    load_weights(task.model, best / "model.safetensors", checkpoint.weights)  # type: ignore[attr-defined]
    return task


#: One example as ids: (the id sequences the model reads, e.g. ``(sentence,)`` or ``(sentence, aspect)``,
#: the label's index).
Encoded = tuple[tuple[list[int], ...], int]


class ClassifierTask(abc.ABC):
    """Batching, training loss, evaluation and prediction of a classification-style task: a model that
    takes ``(ids_1, mask_1, ids_2, mask_2, ...)`` (one pair per id sequence of an :data:`Encoded`
    example, each (B, T_i)) to logits (B, C). Batches are bucketed by the first sequence's length,
    whose mask counts the tokens.

    A subclass sets ``config``, ``model``, ``device``, ``vocab``, ``encoded`` (``{split: [Encoded]}``)
    and ``label_names``, and reads raw texts for :meth:`predict` in :meth:`_encode_text`. Where the model
    reads character features, it sets ``chars`` and ends each example's sequences with the char ids of
    the first sequence's words (:meth:`_with_chars`).
    """

    metric = "accuracy"
    higher_is_better = True
    config: RunConfig
    model: nn.Module
    device: torch.device
    vocab: Vocab
    encoded: dict[str, list[Encoded]]
    label_names: Sequence[str]
    #: The character vocabulary, when the model reads character features (else None).
    chars: Vocab | None = None

    @abc.abstractmethod
    def _encode_text(self, text: str, line: int) -> tuple[tuple[list[int], ...], dict[str, Any]]:
        """A raw text (the ``line``-th given to :meth:`predict`) as the model's id sequences, and the
        fields its prediction record shows besides the label."""

    def _with_chars(self, sequences: tuple[Any, ...], tokens: list[str]) -> tuple[Any, ...]:
        """``sequences``, then the char ids of ``tokens`` (the first sequence's words) when the model reads
        character features (a text without tokens, whose ids are one ``<unk>``, is one word without characters)."""
        return sequences if self.chars is None else (*sequences, encode_chars(tokens, self.chars) or [[]])

    def _inputs(self, sequences: Sequence[tuple[Any, ...]]) -> list[Tensor]:
        """``[ids_1, mask_1, ids_2, mask_2, ...]`` on the model's device, each (B, T_i), then the char
        ids (B, T_1, C) where the model reads them (each example's last sequence, from :meth:`_with_chars`)."""
        words = sequences if self.chars is None else [s[:-1] for s in sequences]
        tensors = []
        for column in zip(*words, strict=True):
            ids, mask = pad_batch(list(column), self.vocab.pad_id)
            tensors += [ids.to(self.device), mask.to(self.device)]
        if self.chars is not None:
            tensors.append(pad_chars([s[-1] for s in sequences], tensors[0].shape[1]).to(self.device))
        return tensors

    def _batch(self, split: str, indices: Sequence[int]) -> tuple[list[Tensor], Tensor]:
        examples = [self.encoded[split][i] for i in indices]
        labels = torch.tensor([label for _, label in examples], device=self.device)  # (B,)
        return self._inputs([sequences for sequences, _ in examples]), labels

    def _batches(self, split: str, size: int, seed: int | None = None) -> list[list[int]]:
        lengths = [len(sequences[0]) for sequences, _ in self.encoded[split]]
        return bucket_batches(lengths, size, shuffle=seed is not None, seed=seed)

    def train_batches(self, epoch: int) -> list[list[int]]:
        return self._batches("train", self.config.train.batch_size, epoch_seed(self.config.train.seed, epoch))

    def train_loss(self, batch: list[int]) -> StepLoss:
        inputs, labels = self._batch("train", batch)
        loss = F.cross_entropy(self.model(*inputs), labels)
        return StepLoss.plus(loss, self.model.auxiliary_loss(), int(inputs[1].sum()), len(batch))

    def evaluate(self, split: str) -> dict[str, float]:
        """``accuracy`` and mean cross-entropy ``loss`` over the examples of ``split``."""
        batches = (self._batch(split, idx) for idx in self._batches(split, self.config.train.eval_batch_size))
        return accuracy_and_loss(self.model, ((self.model(*inputs), labels) for inputs, labels in batches))

    @torch.no_grad()
    def predict(self, texts: list[str]) -> list[dict[str, Any]]:
        """The most probable label of each raw text and every label's probability (plus the fields
        :meth:`_encode_text` gives), in input order."""
        encoded = [self._encode_text(text, line) for line, text in enumerate(texts, 1)]
        results: list[dict[str, Any]] = []
        size = self.config.train.eval_batch_size
        with module_mode(self.model, training=False):
            for start in range(0, len(encoded), size):
                chunk = encoded[start : start + size]
                logits = self.model(*self._inputs([sequences for sequences, _ in chunk]))  # (B, C)
                rows = class_probabilities(logits, self.label_names)
                results.extend({**fields, **row} for (_, fields), row in zip(chunk, rows, strict=True))
        return results
